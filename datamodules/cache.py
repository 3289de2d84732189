"""The uint8 tensor cache of a decoded data set split, in `data_dir/cache/`.

A split is decoded once (pickles, IDX files or image files into uint8 tensors) and cached as one
`torch.save` file; later runs memory-map it in a fraction of a second. A cache is keyed on its source
files (name, size, modification time): when they change it is stale and decoded again. A checksum of its
tensors is written with it and checked on every load: a damaged cache is decoded again too, with a warning.
"""

import hashlib
import os
import warnings
import zlib
from pathlib import Path

import torch

FORMAT = 2  # bump when the layout of the cache files changes. 2: a "checksum" of the tensors


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


def save(path: Path, cached: dict) -> None:
    """Write the cache atomically, with its checksum; a warning, not an error, if it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save({**cached, "checksum": checksum(cached)}, tmp)
        os.replace(tmp, path)  # atomic: a concurrent or interrupted run never sees half a file
    except OSError as e:
        warnings.warn(f"could not write the data cache {path} ({e.strerror}); decoding again next run")
