from choir.cli import main

main()
