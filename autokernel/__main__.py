from autokernel.cli import main

main()
