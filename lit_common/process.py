"""The end of a command's process."""

import gc
import sys
from typing import NoReturn


def leave_the_rest_to_the_system() -> None:
    """Skip the interpreter's last garbage collections, which walk every object torch and Lightning
    made only to free memory that the system takes back with the process. For the very end of a
    process: its loggers, files and checkpoints are closed by then, and atexit hooks still run."""
    gc.freeze()


def exit_with(code: int) -> NoReturn:
    """The command's end, with exit code `code` (see leave_the_rest_to_the_system)."""
    leave_the_rest_to_the_system()
    sys.exit(code)
