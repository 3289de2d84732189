"""Files written whole: the image caches, exports, checkpoints and records all go through `written_whole`."""

import contextlib
import errno
import os
import re
import socket
from pathlib import Path

HOST = socket.gethostname()
TEMPORARY = re.compile(r"\.(\d+)@(.+)\.tmp(\.\w+)?$")  # .NAME.PID@HOST.tmp[.SUFFIX]


@contextlib.contextmanager
def written_whole(path, suffix: str = ""):
    """A temporary path beside `path` to write it through, renamed over it once written (on its own disk: a move
    from another is a copy, which a full disk leaves half done). An exception leaves no temporary file, a killed
    writer's (SIGKILL, SIGTERM's default) goes at the next write there; an OSError names `path`; `suffix` ends it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}@{HOST}.tmp{suffix}")
    try:
        if path.is_dir():  # before the work that would be written, not at the rename after it
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(path.parent)
        tmp.touch()
        yield tmp
        with open(tmp, "rb+") as file:
            os.fsync(file.fileno())  # on the disk before its name is: after a crash, the old file or the new one
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is not None and str(e.filename) != str(tmp):  # another file's: as it is
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        tmp.unlink(missing_ok=True)


def remove_leftovers(folder: Path) -> None:
    """Remove the temporary files in `folder` of writers on this machine that were killed (SIGKILL, power)."""
    for old in folder.glob(".*.tmp*"):
        if (match := TEMPORARY.search(old.name)) and match[2] == HOST and not alive(int(match[1])):
            old.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    try:
        return os.kill(pid, 0) is None
    except OSError as e:
        return e.errno == errno.EPERM  # another user's
