"""The uint8 tensor cache of a decoded data set split, in `data_dir/cache/`.

A split is decoded once (pickles, IDX files or image files into uint8 tensors) and cached as one
`torch.save` file; later runs memory-map it in a fraction of a second. A cache is keyed on its source
files (name, size, modification time): when they change it is stale and decoded again. A checksum of its
tensors is written with it and checked on every load: a damaged cache is decoded again too, with a warning.

Writing the cache is best effort: when it fails (disk full, read-only `data_dir`, ...) the run goes on
with the decoded tensors after a one-line warning, and no temporary file is left behind. Temporary files of
writers that died (kill -9, power cut) are removed by the next run that uses the cache.
"""

import glob
import hashlib
import os
import re
import socket
import time
import warnings
import zlib
from pathlib import Path

import torch

from datamodules.processes import alive

FORMAT = 2  # bump when the layout of the cache files changes. 2: a "checksum" of the tensors

# A temporary file this old is not being written (a writer writes it in one go, seconds): its writer is gone.
# This also covers writers on other hosts sharing `data_dir` (whose pids mean nothing here) and reused pids.
STALE_SECONDS = 15 * 60


def source_key(files: list[Path]) -> str:
    """What a cache must have been built from: the source files' names, sizes and modification times."""
    stats = [(str(f), st.st_size, st.st_mtime_ns) for f in sorted(files) for st in [f.stat()]]
    return hashlib.sha1(repr((FORMAT, stats)).encode()).hexdigest()


def checksum(cached: dict) -> int:
    """CRC-32 of every tensor in `cached` (names, dtypes, shapes and bytes), in the order of their names.

    zlib.crc32 over the tensors' memory: 36 ms for CIFAR-10's 50000x3x32x32 uint8 images (154 MB), 11 ms for
    MNIST's 60000x1x28x28 (47 MB), on one core of the 2-core dev machine (zlib 1.2.13, warm page cache;
    up to 63 and 18 ms with the cores busy). A load then takes ~50 ms instead of 0.4 ms (the memory map
    reads nothing), less than setup's copy of the images (~120 ms), which reads every page anyway.
    zlib.adler32 was no faster (43 and 13 ms); an int64-view sum was (3 and 1 ms) but misses bytes that
    were swapped or moved, and a block of pixels overwritten by its neighbour is what damage looks like.
    """
    crc = 0
    for name in sorted(k for k, v in cached.items() if isinstance(v, torch.Tensor)):
        tensor = cached[name].detach().cpu().contiguous()
        crc = zlib.crc32(repr((name, str(tensor.dtype), tuple(tensor.shape))).encode(), crc)
        if tensor.numel():
            crc = zlib.crc32(tensor.reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


def load(path: Path, key: str) -> dict | None:
    """The cached split at `path` if it was built from `key`'s files and is intact; None if missing, stale,
    unreadable or damaged (with a warning for the last two: the caller decodes it again)."""
    remove_stale_temporaries(path)
    if not path.is_file():
        return None
    try:
        cached = torch.load(path, mmap=True, weights_only=True)
    except Exception as e:  # a truncated or foreign cache file: the caller rebuilds it
        warnings.warn(f"the data cache {path} is unreadable ({type(e).__name__}); decoding again")
        return None
    if not isinstance(cached, dict) or cached.get("key") != key:
        return None  # stale: built from other files, or by an older version of this code
    if cached.get("checksum") != checksum(cached):
        warnings.warn(f"the data cache {path} is damaged (its checksum does not match); decoding again")
        return None
    return cached


class _Writer:
    """The file torch.save writes to, remembering why a write failed.

    torch.save turns an error raised by a file's `write` into a RuntimeError that says "unexpected pos",
    and when it is given a path it reports a full disk the same way: the OSError, kept here, says why.
    """

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def save(path: Path, cached: dict) -> bool:
    """Write the cache atomically, with its checksum; whether it was written.

    Any failure is a one-line warning, not an error (the caller has the tensors, and decodes again next
    run), and the temporary file is removed, so that a full disk is not left fuller.
    """
    tmp = temp_path(path)
    writer = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        with open(tmp, "wb") as file:
            writer = _Writer(file)
            torch.save({**cached, "checksum": checksum(cached)}, writer)
        os.replace(tmp, path)  # atomic: a concurrent or interrupted run never sees half a file
        return True
    except Exception as e:  # torch.save raises RuntimeError for a full disk, pickle errors are others
        error = writer.error if writer is not None and writer.error is not None else e
        reason = error.strerror if isinstance(error, OSError) and error.strerror else _first_line(error)
        warnings.warn(f"could not write the data cache {path} ({reason}); going on without it, decoding "
                      f"again next run")
        return False
    finally:
        # Also on KeyboardInterrupt/SystemExit; after os.replace there is nothing to remove.
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def temp_path(path: Path) -> Path:
    """Where this process writes the cache `path` before renaming it: hidden, named after its host and pid."""
    return path.with_name(f".{path.name}.{_host()}.{os.getpid()}.tmp")


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of `path` that no live writer owns; the ones removed.

    A writer killed with SIGKILL (or by a power cut) cannot remove its own, possibly huge, file. One is
    stale when its writer ran on this host and is no longer running, or when it has not been written to
    for STALE_SECONDS (a writer on another host sharing the folder, or a pid since reused). Temporary
    files of live writers are left alone: they are renamed into place when done.
    """
    removed = []
    prefix, host, now = f".{path.name}.", _host(), time.time()
    try:
        candidates = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    except OSError:
        return removed
    for tmp in candidates:
        # HOST.PID.tmp; the format-1 code wrote PID.tmp, on a host we cannot know: those go by age alone.
        match = re.fullmatch(r"(?:(.+)\.)?(\d+)\.tmp", tmp.name[len(prefix):])
        if not match:
            continue
        try:
            age = now - tmp.lstat().st_mtime
            dead = match[1] == host and not alive(int(match[2]))
            if dead or age > STALE_SECONDS:
                tmp.unlink()
                removed.append(tmp)
        except OSError:  # gone already (its writer finished), or not ours to remove
            pass
    return removed

