from icesink.cli import main

main()
