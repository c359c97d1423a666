from topkbench.cli import main

main()
