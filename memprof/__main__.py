"""`python -m memprof` runs the command line."""
from memprof.cli.main import main

if __name__ == "__main__":
    main()
