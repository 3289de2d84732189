"""The data cache: checked on every load and rebuilt when damaged; a failed write is a warning and leaves
no temporary file, and one left by a killed writer is removed by the next run."""

import errno
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from datamodules import MNISTDataModule, cache

ROOT = Path(__file__).resolve().parent.parent


def mnist(data_dir: Path) -> dict:
    """The training split as the MNIST module loads it (decoding and caching it if need be)."""
    return MNISTDataModule(data_dir=str(data_dir), val_size=100).load_split("train")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_checksum_sees_a_changed_byte_and_swapped_rows():
    images = torch.randint(0, 256, (50, 1, 8, 8), dtype=torch.uint8)
    cached = {"key": "k", "images": images, "labels": torch.arange(50), "mean": torch.tensor([0.5])}
    reference = cache.checksum(cached)
    assert cache.checksum({**cached, "key": "other"}) == reference  # the key is compared, not summed
    changed = images.clone()
    changed[25, 0, 4, 4] ^= 1
    swapped = images[[1, 0, *range(2, 50)]]  # a sum of the bytes would not see this
    assert images[0].ne(images[1]).any()
    for damaged in ({"images": changed}, {"images": swapped}, {"labels": torch.arange(50).flip(0)},
                    {"mean": torch.tensor([0.25])}, {"images": images.reshape(50, 8, 8, 1)}):
        assert cache.checksum({**cached, **damaged}) != reference


def test_pixels_overwritten_in_the_middle_of_a_cache_are_noticed_and_rebuilt(mnist_dir, monkeypatch):
    expected = mnist(mnist_dir)["images"].clone()
    path = mnist_dir / "cache" / "mnist-train.pt"
    data = bytearray(path.read_bytes())
    start = data.find(expected.numpy().tobytes()[:4096])  # where the pixels lie in the file
    assert start > 0 and data.count(expected.numpy().tobytes()[:4096]) == 1
    middle = start + expected.numel() // 2
    data[middle:middle + 512] = bytes(255 - b for b in data[middle:middle + 512])
    path.write_bytes(data)
    # torch alone does not notice: the file's header is intact, its pixels are not
    assert not torch.equal(torch.load(path, weights_only=True)["images"], expected)
    with pytest.warns(UserWarning, match=r"data cache .*mnist-train.pt is damaged .*checksum.*; decoding again"):
        rebuilt = mnist(mnist_dir)
    assert torch.equal(rebuilt["images"], expected)
    # the cache was written again, whole: read back without a warning and without decoding
    monkeypatch.setattr(MNISTDataModule, "decode", lambda self, split: pytest.fail("decoded again"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(mnist(mnist_dir)["images"], expected)


# --- writing it ---------------------------------------------------------------------------------------

class FullDisk:
    """A file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def write(self, data) -> int:
        if len(data) > self.room:
            self.file.write(bytes(data)[:self.room])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def disk_full_midway(monkeypatch):
    real_open = open
    monkeypatch.setattr(cache, "open", lambda path, mode: FullDisk(real_open(path, mode), 100_000), raising=False)
    return r"\(No space left on device\)"  # not torch's "unexpected pos"


def torch_save_fails_midway(monkeypatch):
    def save(obj, file):  # what torch.save does, given a path, on a full disk
        file.write(b"PK" + b"\0" * 100_000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed\nmore lines")
    monkeypatch.setattr(cache.torch, "save", save)
    return r"\(RuntimeError: \[enforce fail .*file write failed\)"


def real_full_disk(monkeypatch):
    # /dev/full fails every write with ENOSPC, as a full disk does; written to through the temporary file's name
    monkeypatch.setattr(cache, "temp_path", lambda path: path.with_name(f".{path.name}.dev-full.tmp"))
    return r"\(No space left on device\)"


@pytest.mark.parametrize("fault", [disk_full_midway, torch_save_fails_midway, real_full_disk])
def test_a_failed_cache_write_is_one_warning_and_leaves_nothing_behind(fault, mnist_dir, monkeypatch):
    message = fault(monkeypatch)
    folder = mnist_dir / "cache"
    if fault is real_full_disk:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        folder.mkdir()
        for split in ("train", "test"):
            (folder / f".mnist-{split}.pt.dev-full.tmp").symlink_to("/dev/full")
    with pytest.warns(UserWarning) as caught:
        dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100)
        dm.prepare_data()
        dm.setup("fit")  # the run goes on with the decoded images
    assert len(dm.splits["train"][0]) == 500 and len(dm.splits["test"][0]) == 200
    written = [str(w.message) for w in caught if "could not write" in str(w.message)]
    assert len(written) == 2  # train and test
    assert all("\n" not in m for m in written)
    assert all(re.search(rf"could not write the data cache .*mnist-t\w+.pt {message}; going on", m) for m in written)
    assert leftovers(folder) == []  # no temporary file left, not even the link


def test_ctrl_c_while_writing_the_cache_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupted(obj, file):
        file.write(b"PK" + b"\0" * 100_000)
        raise KeyboardInterrupt
    monkeypatch.setattr(cache.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.save(tmp_path / "cache" / "x.pt", {"key": "k", "images": torch.zeros(10)})
    assert leftovers(tmp_path / "cache") == []


def test_a_read_only_data_dir_is_a_warning(mnist_dir):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the fault tests above cover the write failing")
    (mnist_dir / "cache").mkdir()
    (mnist_dir / "cache").chmod(0o555)
    try:
        with pytest.warns(UserWarning, match=r"could not write the data cache .* \(Permission denied\)"):
            assert len(mnist(mnist_dir)["images"]) == 600
    finally:
        (mnist_dir / "cache").chmod(0o755)
    assert leftovers(mnist_dir / "cache") == []


def test_a_cache_folder_that_cannot_be_made_is_a_warning(mnist_dir):
    (mnist_dir / "cache").write_text("not a folder")  # even root cannot make a folder here
    with pytest.warns(UserWarning, match=r"could not write the data cache .*mnist-train.pt \(File exists\)"):
        assert len(mnist(mnist_dir)["images"]) == 600


def test_temporary_files_of_dead_writers_are_removed_and_of_live_ones_kept(tmp_path):
    path = tmp_path / "mnist-train.pt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = cache.temp_path(path).name.split(".")[-3]
    old = time.time() - cache.STALE_SECONDS - 60
    files = {
        f".mnist-train.pt.{host}.{dead_pid}.tmp": ("removed", None),  # this host, writer gone (kill -9)
        f".mnist-train.pt.{host}.{os.getpid()}.tmp": ("kept", None),  # this host, writer alive
        f".mnist-train.pt.{host}.{os.getpid()}0.tmp": ("removed", old),  # a pid, idle this long: not a writer
        f".mnist-train.pt.other-host.{dead_pid}.tmp": ("kept", None),  # another host's: its pids are not ours
        f".mnist-train.pt.other-host.{os.getpid()}.tmp": ("removed", old),  # ...unless idle for long
        f".mnist-train.pt.{dead_pid}.tmp": ("kept", None),  # format 1's names: by age alone
        f".mnist-train.pt.{dead_pid + 1}.tmp": ("removed", old),
        f".mnist-test.pt.{host}.{dead_pid}.tmp": ("kept", None),  # another cache's
        ".mnist-train.pt.notes.tmp": ("kept", old),  # not a name we write
    }
    for name, (_, mtime) in files.items():
        (tmp_path / name).write_bytes(b"x")
        if mtime:
            os.utime(tmp_path / name, (mtime, mtime))
    removed = cache.remove_stale_temporaries(path)
    assert sorted(p.name for p in removed) == sorted(n for n, (fate, _) in files.items() if fate == "removed")
    assert leftovers(tmp_path) == sorted(n for n, (fate, _) in files.items() if fate == "kept")


# A writer that stops, after 1 MB, for a minute: long enough to be killed with SIGKILL mid-write.
SLOW_WRITER = """
import importlib.util, sys, time
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("cache", sys.argv[1])  # not the package: no Lightning import
cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cache)
real_save = torch.save

class Slow:
    def __init__(self, file):
        self.file, self.written = file, 0
    def write(self, data):
        self.written += self.file.write(data)
        if self.written > 1 << 20:
            self.file.flush()
            print("writing", flush=True)
            time.sleep(60)
        return len(data)
    def flush(self):
        self.file.flush()

torch.save = lambda obj, file: real_save(obj, Slow(file))
cache.save(Path(sys.argv[2]), {"key": "k", "images": torch.ones(8 << 20, dtype=torch.uint8)})
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_cache_writer_killed_mid_write_leaves_a_temporary_that_the_next_run_removes(tmp_path):
    path = tmp_path / "cache" / "big.pt"
    writer = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(ROOT / "datamodules" / "cache.py"), str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "writing\n"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    (left,) = path.parent.iterdir()
    assert left.name.startswith(".big.pt.") and left.stat().st_size > 1 << 20 and not path.exists()
    images = torch.arange(1000).to(torch.uint8)
    assert cache.save(path, {"key": "k", "images": images})
    assert leftovers(path.parent) == ["big.pt"]
    assert torch.equal(cache.load(path, "k")["images"], images)
    # a load alone removes one too (a run that finds the cache valid writes nothing)
    left.write_bytes(b"x")
    assert cache.load(path, "k") is not None and leftovers(path.parent) == ["big.pt"]
