import sys

from .cli import main

if __name__ == "__main__":  # importing the module (the API docs walk every module) must not run the CLI
    sys.exit(main())
