"""Files written whole: image caches, exports, predictions, records and checkpoints go to a
temporary file beside their name first, and take the name only once written."""

import contextlib
import errno
import io
import os
from pathlib import Path

import torch
from lightning.pytorch.plugins import TorchCheckpointIO


@contextlib.contextmanager
def written_whole(path, suffix: str = ""):
    """A temporary path beside `path` to write it through, renamed over it once written (on its own
    disk: a move from another is a copy, which a full disk leaves half done). An exception leaves no
    temporary file; an OSError names `path`; `suffix` ends the temporary name."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{suffix}")
    try:
        if path.is_dir():  # before the work that would be written, not at the rename after it
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
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
    next one. The file is for `written_whole` to replace; it is removed if the block fails before
    that."""
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


def output_file(output: str | None, kept: list, folder: Path, stem: str, suffix: str):
    """A context of the file a command writes: `output`, replaced as asked, unless it is one of
    the files `kept` (the checkpoint, an input: a slip that would lose it, refused in one line);
    or a new file folder/stem`suffix` of its own (`new_file`)."""
    if not output:
        return new_file(folder, stem, suffix)
    path = Path(output).expanduser()
    for other in filter(None, kept):  # files this command reads: they are there
        if path.exists() and os.path.samefile(path, other):
            raise FileExistsError(errno.EEXIST, f"--output {path} is {other}, which this "
                                                f"command reads; name another file")
    return contextlib.nullcontext(path)


class WholeCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO through a temporary file beside the checkpoint (`written_whole`), not the
    system's temporary folder, from which fsspec moves it by a copy that a full disk leaves
    truncated under the checkpoint's name (fsspec/filesystem_spec#544). Remote paths: Lightning's.
    """

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        # torch.save turns a write error into a RuntimeError without a reason: errors as OSError
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        with written_whole(path) as tmp, open(tmp, "wb") as file:
            file.write(buffer.getbuffer())
