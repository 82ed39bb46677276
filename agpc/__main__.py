"""The ``agpc`` command (``python -m agpc``, and the console script of ``[project.scripts]``): ``agpc.cli``.

Loading the command line takes a second or two (NumPy, SciPy, scikit-learn; ``import agpc`` itself loads
nothing): a Ctrl-C meanwhile ends the command as one during it does, with one line and exit status 130, not
with Python's traceback.
"""

import sys

try:
    from .cli import main
except KeyboardInterrupt:
    if sys.stderr is not None:
        sys.stderr.write("agpc: interrupted\n")
    sys.exit(130)

__all__ = ["main"]

if __name__ == "__main__":  # importing the module (the API docs walk every module) must not run the CLI
    sys.exit(main())
