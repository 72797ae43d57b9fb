from services.bridge.app import main

main()
