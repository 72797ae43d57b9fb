from services.extender.app import main

main()
