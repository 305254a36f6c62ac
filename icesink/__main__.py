from icesink.app.cli import main

main()
