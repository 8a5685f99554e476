from kit.main import main

main()
