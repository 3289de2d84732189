"""Files written whole: the image caches, exports, checkpoints and records all go through
`written_whole`; Lightning's checkpoints through `WholeCheckpointIO`."""

import contextlib
import errno
import io
import os
import re
import socket
import time
from pathlib import Path

import torch
from lightning.pytorch.plugins import TorchCheckpointIO

HOST = socket.gethostname()
TEMPORARY = re.compile(r"\.(\d+)@(.+)\.tmp(\.\w+)?$")  # .NAME.PID@HOST.tmp[.SUFFIX]


@contextlib.contextmanager
def written_whole(path, suffix: str = ""):
    """A temporary path beside `path` to write it through, renamed over it once written (on its own
    disk: a move from another is a copy, which a full disk leaves half done). An exception leaves no
    temporary file, a killed writer's (SIGKILL, SIGTERM's default) goes at the next write there; an
    OSError names `path`; `suffix` ends it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}@{HOST}.tmp{suffix}")
    try:
        if path.is_dir():  # before the work that would be written, not at the rename after it
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(path.parent)
        tmp.touch()
        yield tmp
        # on the disk before its name is: after a crash, the old file or the new one
        with open(tmp, "rb+") as file:
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is not None and str(e.filename) != str(tmp):  # another file's: as it is
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def new_file(folder: Path, stem: str, suffix: str):
    """A new, empty file folder/stem.suffix, or stem-1.suffix, stem-2.suffix, ...: the first name
    free, taken at once (O_CREAT | O_EXCL), so that a command started in the same second takes the
    next one (a check, then a rename, gave two commands one name: the second replaced the first).
    The file is for `written_whole` to replace; it is removed if the block fails before that."""
    folder.mkdir(parents=True, exist_ok=True)
    path, k = folder / f"{stem}{suffix}", 1
    while True:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            path, k = folder / f"{stem}-{k}{suffix}", k + 1
    try:
        yield path
    except BaseException:
        # still the empty file taken here: the whole one that replaced it stays
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()
        raise


def output_over(path: Path, kept: list) -> Path:
    """An explicit output `path`, replaced as asked, unless it is one of the files `kept` (the
    checkpoint, an input): a slip that would lose it. A ValueError names which."""
    for other in filter(None, kept):
        with contextlib.suppress(OSError):  # one that is not there is not lost
            if os.path.samefile(path, other):
                raise ValueError(f"{path} is {other}, which this command reads")
    return path


def remove_leftovers(folder: Path) -> None:
    """Remove the temporary files in `folder` of writers on this machine that were killed (SIGKILL,
    power)."""
    for old in folder.glob(".*.tmp*"):
        match = TEMPORARY.search(old.name)
        written_here = match and match[2] == HOST
        if written_here and not alive(int(match[1])):
            old.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    try:
        return os.kill(pid, 0) is None
    except OSError as e:
        return e.errno == errno.EPERM  # another user's


class WholeCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO through a temporary file beside the checkpoint (`written_whole`), not the
    system's temporary folder, where a full disk left a truncated one under its name; train.py's
    default. s3:// paths: Lightning's."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        # torch.save turns a write error into a RuntimeError without a reason: errors as OSError
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        with written_whole(path) as tmp, open(tmp, "wb") as file:
            file.write(buffer.getbuffer())


class Claimed:
    """A folder a command writes in (a run's), as the command found it: what the command wrote
    there is taken back (`give_back`) if it fails before it writes a checkpoint, so that a failed
    command leaves no run folder, and no file in a run it went on with.

    Args:
        folder: the folder, made now if it is not there.
        made: folders above it that the command made for it, taken back with it.
    """

    def __init__(self, folder: Path, made: list[Path]):
        self.folder = folder.absolute()
        self.made = [p for p in [self.folder] if not p.exists()] + made
        self.found, self.since = set(self.folder.rglob("*")), time.time()
        self.folder.mkdir(parents=True, exist_ok=True)

    def give_back(self) -> None:
        """Remove what the command wrote in the folder, unless it wrote a checkpoint there."""
        if not self.folder.is_dir():
            return
        if any(c.stat().st_mtime >= self.since for c in self.folder.rglob("*.ckpt")):
            return
        new = set(self.folder.rglob("*")) - self.found
        for path in sorted(new, key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        for folder in self.made:
            with contextlib.suppress(OSError):  # not empty: another process's run is there now
                folder.rmdir()
