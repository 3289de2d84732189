"""The start and end of a command's process."""

import gc
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

SIGNALS = {signal.SIGINT: ("Ctrl-C", 130), signal.SIGTERM: ("SIGTERM", 143)}


def stop_while_starting() -> None:
    """One line and exit 130 (Ctrl-C) or 143 (SIGTERM) for a stop in a command's first seconds,
    while Python imports torch and Lightning, where it would print a KeyboardInterrupt's
    traceback or end without a word. For the very start of a script's process (`__main__`); the
    command's own handlers take over once it runs."""
    for signum in SIGNALS:
        signal.signal(signum, stopped_while_starting)


def stopped_while_starting(signum, frame) -> NoReturn:
    name, code = SIGNALS[signum]
    print(f"{Path(sys.argv[0]).name}: stopped by {name} before the command started; nothing was "
          f"written", file=sys.stderr, flush=True)
    # Not SystemExit: raised while an extension module initialises during the imports, it can be
    # lost there, and the command ran on to exit 0 after this line. Nothing of the command's is
    # open yet, so nothing is lost by ending the process here.
    os._exit(code)


def starting(handler) -> bool:
    """Whether `handler` is Python's own, or stop_while_starting's: not a caller's."""
    return handler in (signal.SIG_DFL, signal.default_int_handler, stopped_while_starting)


def python_default(handler, signum: int):
    """`handler`, or Python's own for `signum` in place of stop_while_starting's, whose line says
    the command has not started: what a command's own handlers give back when it ends."""
    if handler is not stopped_while_starting:
        return handler
    return {signal.SIGINT: signal.default_int_handler}.get(signum, signal.SIG_DFL)


def leave_the_rest_to_the_system() -> None:
    """Skip the interpreter's last garbage collections, which walk every object torch and Lightning
    made only to free memory that the system takes back with the process. For the very end of a
    process: its loggers, files and checkpoints are closed by then, and atexit hooks still run."""
    gc.freeze()


def exit_with(code: int) -> NoReturn:
    """The command's end, with exit code `code` (see leave_the_rest_to_the_system)."""
    leave_the_rest_to_the_system()
    sys.exit(code)
