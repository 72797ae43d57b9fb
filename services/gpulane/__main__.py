from services.gpulane.server import main

main()
