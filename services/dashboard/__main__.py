from services.dashboard.app import main

main()
