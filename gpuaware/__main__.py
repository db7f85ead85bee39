from gpuaware.cli import main

main()
