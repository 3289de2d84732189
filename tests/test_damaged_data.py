"""Damaged data files: whatever the format, one reader wrapper (datamodules.base.reading) ends the
command in one line that names the file, what went wrong, and how to get a whole copy, with exit
code 1 and no traceback; a damaged image cache is decoded again; a folder that cannot be written
is not a damaged file."""

import errno
import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_train, write_cifar10, write_idx, write_mnist
from test_image_folder import ready, write_folder

from datamodules import (
    CIFAR10DataModule,
    DataError,
    ImageDataModule,
    ImageFolderDataModule,
    MNISTDataModule,
)

IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
FETCH = "delete it and run again with --data.download true to download {} again, or put a whole "


def cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def type_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[2] = 0x0A  # the type of the values in the magic number (torchvision: a KeyError)
    path.write_bytes(bytes(data))


def folder_in_place(path: Path) -> None:
    path.unlink()
    path.mkdir()


def edit_batch(change):
    """A change to a CIFAR-10 pickle's dict, written back as a whole pickle."""
    def damage(path: Path) -> None:
        batch = pickle.loads(path.read_bytes(), encoding="latin1")
        change(batch)
        path.write_bytes(pickle.dumps(batch))
    return damage


def unreadable(path: Path, monkeypatch) -> None:
    """Reading `path` refused, as for a file of another user's (root reads any)."""
    real = Path.read_bytes

    def read_bytes(self):
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


MNIST_ARGS = ["--model", "mlp", "--trainer.max_epochs", "1", "--data.batch_size", "64"]
CIFAR_ARGS = [*MNIST_ARGS[:2], "--data", "CIFAR10DataModule", *MNIST_ARGS[2:]]
# What is damaged, how, what the line says went wrong, and the data set it says to download again
# (None: an image of the user's, to replace or remove). The first of each format through the
# command line, the others through the data module alone (faster; the same line).
DAMAGES = {
    "CIFAR-10 pickle truncated": ("cifar", "data_batch_2", lambda p: cut(p, 1000),
                                  "UnpicklingError: pickle data was truncated", "CIFAR-10"),
    "CIFAR-10 pickle of garbage": ("cifar", "data_batch_2", lambda p: p.write_bytes(b"a text"),
                                   "UnpicklingError: unpickling stack underflow", "CIFAR-10"),
    "IDX truncated": ("mnist", IMAGES, lambda p: cut(p, 999),
                      "RuntimeError: shape '[600, 28, 28]' is invalid for input of size 983",
                      "MNIST"),
    "IDX header": ("mnist", IMAGES, type_byte,
                   "ValueError: not an IDX file of bytes: it begins '00 00 0a 03'", "MNIST"),
    ".gz truncated": ("gz", f"{IMAGES}.gz", lambda p: cut(p, 300),
                      "EOFError: Compressed file ended before the end-of-stream marker", "MNIST"),
    "an image that cannot be decoded": ("images", "train/cat/0001.png",
                                        lambda p: p.write_bytes(b"not a png"),
                                        "UnidentifiedImageError: cannot identify image file",
                                        None),
    # through the data module alone
    "CIFAR-10 pickle of another object": ("cifar", "data_batch_1",
                                          lambda p: p.write_bytes(pickle.dumps([1, 2])),
                                          "TypeError: list indices must be integers", "CIFAR-10"),
    "CIFAR-10 pickle, a folder in its place": ("cifar", "data_batch_3", folder_in_place,
                                               "(Is a directory)", "CIFAR-10"),
    "CIFAR-10 pickle empty": ("cifar", "data_batch_1", lambda p: p.write_bytes(b""),
                              "EOFError: Ran out of input", "CIFAR-10"),
    "CIFAR-10 pickle with fewer labels": ("cifar", "data_batch_4", edit_batch(
        lambda batch: batch.update(labels=batch["labels"][:50])), "shape '[100]' is invalid for "
        "input of size 50", "CIFAR-10"),
    "CIFAR-10 pickle that cannot be read": ("cifar", "data_batch_5", "unreadable",
                                            "(Permission denied)", "CIFAR-10"),
    "IDX header cut": ("mnist", IMAGES, lambda p: p.write_bytes(b"\0\0\x08\x03\0"),
                       "error: unpack requires a buffer of 12 bytes", "MNIST"),
    "IDX sizes": ("mnist", IMAGES, lambda p: p.write_bytes(p.read_bytes()[:5] + b"\x7f"
                                                           + p.read_bytes()[6:]),
                  "RuntimeError: shape '[8323672, 28, 28]' is invalid", "MNIST"),
    "IDX dimensions": ("mnist", IMAGES, lambda p: p.write_bytes(p.read_bytes()[:3] + b"\x02"
                                                                + p.read_bytes()[4:]),
                       "RuntimeError: shape '[600, 28]' is invalid", "MNIST"),
    "IDX images of another size": ("mnist", IMAGES, lambda p: write_idx(p, np.zeros((600, 32, 32))),
                                   "RuntimeError: shape '[-1, 28, 28]' is invalid", "MNIST"),
    "IDX with fewer labels": ("mnist", LABELS, lambda p: write_idx(p, np.zeros(10)),
                              "RuntimeError: shape '[600]' is invalid for input of size 10",
                              "MNIST"),
    "IDX empty": ("mnist", LABELS, lambda p: p.write_bytes(b""),
                  "ValueError: not an IDX file of bytes: it begins ''", "MNIST"),
    "IDX a folder in its place": ("mnist", LABELS, folder_in_place, "(Is a directory)", "MNIST"),
    "IDX that cannot be read": ("mnist", LABELS, "unreadable", "(Permission denied)", "MNIST"),
    ".gz not gzip": ("gz", f"{IMAGES}.gz", lambda p: p.write_bytes(b"IDX? no"),
                     "BadGzipFile: Not a gzipped file", "MNIST"),
    ".gz of a damaged IDX file": ("gz", f"{IMAGES}.gz", lambda p: p.write_bytes(
        gzip.compress(gzip.decompress(p.read_bytes())[:999])), "RuntimeError: shape", "MNIST"),
}
ON_THE_COMMAND_LINE = list(DAMAGES)[:6]


def data_with(kind: str, tmp_path: Path) -> tuple[Path, list[str], ImageDataModule]:
    """A data set of `kind` written under tmp_path: the folder the damaged file's name is
    relative to, the command line that reads it, and its data module."""
    data = tmp_path / "data"
    if kind == "images":
        root = write_folder(tmp_path / "images", {"train": 16, "test": 8})
        return root, [*MNIST_ARGS[:2], "--data", "ImageFolderDataModule", "--data.root",
                      str(root), "--data.data_dir", str(data), *MNIST_ARGS[2:]], (
            ImageFolderDataModule(str(root), data_dir=str(data)))
    if kind == "cifar":
        folder = write_cifar10(data) / "cifar-10-batches-py"
        return folder, [*CIFAR_ARGS, "--data.data_dir", str(data)], CIFAR10DataModule(str(data))
    raw = write_mnist(data, compress=kind == "gz") / "MNIST" / "raw"
    return raw, [*MNIST_ARGS, "--data.data_dir", str(data)], MNISTDataModule(str(data))


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_data_file_is_named_with_how_to_get_it_again(damage, tmp_path, monkeypatch,
                                                               capsys):
    kind, name, write, reason, data_set = DAMAGES[damage]
    folder, args, module = data_with(kind, tmp_path)
    if write == "unreadable":
        unreadable(folder / name, monkeypatch)
    else:
        write(folder / name)
    if damage in ON_THE_COMMAND_LINE:
        monkeypatch.chdir(tmp_path)
        assert run_train(args) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        line = err.strip().splitlines()[-1].removeprefix("train.py: error: ")
    else:
        with pytest.raises(DataError) as error:
            module.prepare_data()
            module.setup("fit")
        line = str(error.value)
    assert "\n" not in line and reason in line
    assert line.startswith(f"cannot read {'the image ' * (kind == 'images')}{folder / name} (")
    fix = FETCH.format(data_set)
    if data_set is None:
        fix = "replace or remove it"
    assert fix in line
    if kind == "gz":  # nothing unpacked from it, which the next run would read instead
        assert not (folder / name.removesuffix(".gz")).exists()


def test_gz_files_in_a_folder_that_cannot_be_written_are_read_in_memory(tmp_path, monkeypatch):
    """A read-only folder of the four .gz files (as a system package ships them: Debian's
    Fashion-MNIST, whose gzip streams are not torchvision's) is read as it is."""
    expected = MNISTDataModule(str(write_mnist(tmp_path / "plain"))).read("train")
    raw = write_mnist(tmp_path / "gz", compress=True) / "MNIST" / "raw"
    before = sorted(raw.iterdir())
    for method in ("write_bytes", "touch"):  # refused there, as on a read-only mount
        def refuse(path, *args, _real=getattr(Path, method), **kwargs):
            if path.parent == raw:
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return _real(path, *args, **kwargs)
        monkeypatch.setattr(Path, method, refuse)
    dm = MNISTDataModule(data_dir=str(tmp_path / "gz"), download=False)
    dm.prepare_data()
    images, labels = dm.read("train")
    assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
    assert sorted(raw.iterdir()) == before


@pytest.mark.parametrize("module", [MNISTDataModule, CIFAR10DataModule])
def test_a_download_that_cannot_write_into_the_folder_says_so(module, tmp_path, monkeypatch):
    def download(*args, **kwargs):  # as torchvision's fails in a folder of another user's
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path))

    monkeypatch.setattr("torchvision.datasets.MNIST.download", download)
    monkeypatch.setattr("datamodules.cifar10.download_and_extract_archive", download)
    with pytest.raises(DataError) as error:
        module(data_dir=str(tmp_path)).prepare_data()
    assert str(error.value).startswith(f"{tmp_path} cannot be written (Permission denied)")
    assert "downloaded into" in str(error.value)
    assert "could not be downloaded" not in str(error.value)


# --- an image folder's cache (data_dir/cache/): a damaged one is decoded again, never trusted

CACHE_DAMAGES = {
    "empty": lambda p: p.write_bytes(b""),  # np.load's EOFError was a traceback
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:300]),
    "not numpy's format": lambda p: p.write_bytes(b"\x93NUMPY" + b"?" * 200),
    "fewer images": lambda p: np.save(p, np.zeros((3, 3, 16, 16), np.uint8)),  # read as 3 images
    "float values": lambda p: np.save(p, np.zeros((40, 3, 16, 16), np.float32)),  # trained on
    "another size": lambda p: np.save(p, np.zeros((40, 3, 8, 8), np.uint8)),  # than asked for
    "Fortran order": lambda p: np.save(p, np.asfortranarray(np.zeros((40, 3, 16, 16), np.uint8))),
    "objects": lambda p: np.save(p, np.array([{}], dtype=object), allow_pickle=True),
}


@pytest.mark.parametrize("damage", CACHE_DAMAGES)
def test_a_damaged_image_cache_is_decoded_again(damage, tmp_path):
    root = write_folder(tmp_path / "images", {"train": 40, "test": 8})
    expected = ready(root, tmp_path, image_size=16).read("train")[0]
    (cache,) = (tmp_path / "data" / "cache").glob("*-train-*.npy")
    CACHE_DAMAGES[damage](cache)
    images = ready(root, tmp_path, image_size=16, in_memory=False).read("train")[0]
    assert images.shape == expected.shape == (40, 3, 16, 16)  # as DiskImages, read from the file
    assert torch.equal(images.index_select(0, torch.arange(40)), expected)
    assert np.array_equal(np.load(cache), expected.numpy())  # and cached again, whole
