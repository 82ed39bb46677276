"""The ``agpc`` command (``python -m agpc``, and the console script of ``[project.scripts]``): ``agpc.cli``.

Loading the command line takes a second or two (NumPy, SciPy, scikit-learn; ``import agpc`` itself loads
nothing): a Ctrl-C meanwhile ends the command as one during it does, with one line and exit status 130, not
with Python's traceback.
"""

import signal
import sys
import threading

# As while a command runs (``agpc.cli``): SIGINT interrupts the loading too when the process inherited it ignored
# (a background job of a script, a test runner started so), where Python would leave it ignored. Only the main
# thread may set a handler; the caller's disposition is back once the command line is loaded.
_previous = signal.signal(signal.SIGINT, signal.default_int_handler) if (
    threading.current_thread() is threading.main_thread()) else None
try:
    from .cli import main
except KeyboardInterrupt:
    if sys.stderr is not None:
        sys.stderr.write("agpc: interrupted\n")
    sys.exit(130)
finally:
    if _previous is not None:
        signal.signal(signal.SIGINT, _previous)

__all__ = ["main"]

if __name__ == "__main__":  # importing the module (the API docs walk every module) must not run the CLI
    sys.exit(main())
