"""What a user can fix, in one line and an exit code: 2 for the command line, 1 for the data, a
checkpoint or the run, 130 and 143 for Ctrl-C and SIGTERM."""

import sys
import traceback
from argparse import ArgumentError

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from datamodules import DataError
from lit_models import ModelError


class UsageError(Exception):
    """A command line that cannot run (exit code 2)."""


class Stopped(Exception):
    """A run stopped by a signal; the message says where, and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# The exit code of each kind of error a user can act on.
EXIT_CODES = {UsageError: 2, MisconfigurationException: 2, DataError: 1, ModelError: 1}


def explain(error: BaseException) -> tuple[int | None, str]:
    """The exit code and one line for what a user can fix, found among the error and its causes
    (jsonargparse wraps what a class raises while it builds it); (None, "") for a bug."""
    e, depth = error, 0
    while e is not None and depth < 20:
        found = known(e)
        if found is not None:
            return found
        e, depth = e.__cause__ or e.__context__, depth + 1
    return None, ""


def known(e: BaseException) -> tuple[int, str] | None:
    """The exit code and line for one error, if it is one a user can act on."""
    if isinstance(e, Stopped):
        return e.exit_code, str(e)
    if isinstance(e, ArgumentError):  # jsonargparse's: the command line's, in its own words
        return 2, not_found(e) or str(e)
    for kind, code in EXIT_CODES.items():
        if isinstance(e, kind):
            return code, str(e)
    if isinstance(e, torch.OutOfMemoryError):
        return 1, ("out of memory on the device: try a smaller --data.batch_size (or "
                   "--data.on_device false)")
    if isinstance(e, MemoryError):
        return 1, ("out of memory in this machine's RAM: try a smaller --data.image_size or "
                   "fewer images")
    if isinstance(e, ModuleNotFoundError):
        if not e.name:
            return 1, str(e)
        return 1, f"this needs the package '{e.name}' (pip install {e.name})"
    if isinstance(e, OSError) and e.strerror:
        return 1, f"{e.strerror}: {e.filename or ''}"
    return None


def not_found(error: ArgumentError) -> str | None:
    """What to say of a class path that names a module Python cannot find, among the causes of
    jsonargparse's error (it lists what each alternative of a type said, at length)."""
    e = error
    while e is not None and not isinstance(e, ModuleNotFoundError):
        e = e.__cause__ or e.__context__
    if e is None or not e.name:
        return None
    return (f"no module named '{e.name}': a module of your own is found on the PYTHONPATH "
            f"(PYTHONPATH=. python train.py ..., where {e.name}.py lies in .), and an "
            f"installed package's class by its import path")


def exit_code(error: BaseException, verbose: bool = False) -> int:
    """The exit code of what ended a command, with its one line (and the traceback of a bug, or
    of anything with `verbose`) on stderr."""
    # jsonargparse's help (0) or error (2), Lightning's end of a Ctrl-C (1), a finished run (0)
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else 0  # None: Lightning's SIGTERM
    code, message = explain(error)
    if code is None or verbose:
        traceback.print_exception(error)
    if code is None:
        return 1
    print(f"train.py: error: {message}", file=sys.stderr)
    return code
