"""The uint8 tensor cache of a decoded data set split, in `data_dir/cache/`.

A split is decoded once (pickles, IDX files or image files into uint8 tensors) and cached as one
`torch.save` file; later runs memory-map it in a fraction of a second. A cache is keyed on its source
files (name, size, modification time): when they change it is stale and decoded again.
"""

import hashlib
import os
import warnings
from pathlib import Path

import torch

FORMAT = 1  # bump when the layout of the cache files changes


def source_key(files: list[Path]) -> str:
    """What a cache must have been built from: the source files' names, sizes and modification times."""
    stats = [(str(f), st.st_size, st.st_mtime_ns) for f in sorted(files) for st in [f.stat()]]
    return hashlib.sha1(repr((FORMAT, stats)).encode()).hexdigest()


def load(path: Path, key: str) -> dict | None:
    """The cached split at `path` if it was built from `key`'s files; None if missing, stale or unreadable."""
    if not path.is_file():
        return None
    try:
        cached = torch.load(path, mmap=True, weights_only=True)
    except Exception:  # a truncated or foreign cache file: the caller rebuilds it
        return None
    return cached if isinstance(cached, dict) and cached.get("key") == key else None


def save(path: Path, cached: dict) -> None:
    """Write the cache atomically; a warning, not an error, if it cannot be written (decoded again next run)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(cached, tmp)
        os.replace(tmp, path)  # atomic: a concurrent or interrupted run never sees half a file
    except OSError as e:
        warnings.warn(f"could not write the data cache {path} ({e.strerror}); decoding again next run")
