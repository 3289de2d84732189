"""What a user can fix, in one line and an exit code: 2 for the command line, 1 for the data, a
checkpoint or the run, 130 and 143 for Ctrl-C and SIGTERM."""

import sys
import traceback
from argparse import ArgumentError

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from datamodules import DataError
from lit_models import ModelError

# The install command of the packages of each optional part (pyproject.toml's extras).
EXTRAS = {"onnx": "export", "onnxruntime": "export", "onnxscript": "export", "optuna": "sweep",
          "optuna_integration": "sweep", "pandas": "sweep", "psycopg": "sweep"}


class UsageError(Exception):
    """A command line that cannot run (exit code 2)."""


class Stopped(Exception):
    """A command stopped by a signal; the message says where, and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# The exit code of each kind of error a user can act on.
EXIT_CODES = {Stopped: None, UsageError: 2, ArgumentError: 2, MisconfigurationException: 2,
              DataError: 1, ModelError: 1, UnicodeDecodeError: 2}  # a --config that is no text


def explain(error: BaseException) -> tuple[int | None, str]:
    """The exit code and one line for what a user can fix, found among the error and its causes
    (jsonargparse wraps what a class raises while it builds it); (None, "") for a bug."""
    while error is not None:
        found = known(error)
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None, ""


def known(e: BaseException) -> tuple[int, str] | None:
    """The exit code and line for one error, if it is one a user can act on."""
    for kind, code in EXIT_CODES.items():
        if isinstance(e, kind):  # jsonargparse's are several lines: one
            return getattr(e, "exit_code", code), " ".join(str(e).split())
    if isinstance(e, torch.OutOfMemoryError):
        return 1, "out of memory on the device: try a smaller --data.batch_size"
    if isinstance(e, ModuleNotFoundError) and not e.name:  # Lightning's, its install command in it
        return 1, " ".join(str(e).split())
    if isinstance(e, ModuleNotFoundError):
        top = e.name.split(".")[0]
        install = f"pip install -e '.[{EXTRAS[top]}]'" if top in EXTRAS else f"pip install {top}"
        return 1, f"this needs the package '{top}': {install}"
    if isinstance(e, OSError) and e.strerror:
        return 1, f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return None


def exit_code(error: BaseException, verbose: bool = False, program: str = "train.py") -> int:
    """The exit code of what ended `program`, with its one line (and the traceback of a bug, or
    of anything with `verbose`) on stderr."""
    # jsonargparse's help (0), Lightning's end of a KeyboardInterrupt (1)
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else 0
    code, message = explain(error)
    if code is None or verbose:
        traceback.print_exception(error)
    if code is None:
        return 1
    said = message if isinstance(error, Stopped) else f"error: {message}"
    print(f"{program}: {said}", file=sys.stderr)
    return code
