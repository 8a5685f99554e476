from kit.app import main

main()
