"""Damaged data files: each ends in one DataError line that names the file and what is wrong with
it, never a traceback, never another file; a folder that cannot be written is not a damaged file.
"""

import errno
import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_cifar10, write_idx, write_mnist

from datamodules import CIFAR10DataModule, DataError, MNISTDataModule

IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"


def edit_header(byte: int, value: int):
    def damage(raw):
        data = bytearray((raw / IMAGES).read_bytes())
        data[byte] = value
        (raw / IMAGES).write_bytes(bytes(data))
    return damage


def replace_folder(path):
    path.unlink()
    path.mkdir()


def gzip_damaged(raw):
    data = bytearray(gzip.decompress((raw / f"{IMAGES}.gz").read_bytes()))
    data[2] = 0x0B  # int16 values: torchvision's reader raised a TypeError
    (raw / f"{IMAGES}.gz").write_bytes(gzip.compress(bytes(data)))


IDX_DAMAGES = {
    # the example: the type byte of the magic number (torchvision: KeyError, TypeError)
    "type byte": (IMAGES, edit_header(2, 0x0A), "not an IDX file of 3-dimensional bytes: "
                  "it begins 00 00 0a 03, not 00 00 08 03"),
    "int8 type": (IMAGES, edit_header(2, 0x09), "it begins 00 00 09 03"),
    "dimensions": (IMAGES, edit_header(3, 0x02), "it begins 00 00 08 02"),
    "a size": (IMAGES, edit_header(5, 0x7F), "where its header says 8323672 x 28 x 28"),
    "truncated": (IMAGES, lambda raw: (raw / IMAGES).write_bytes((raw / IMAGES).read_bytes()[:999]),
                  "holds 983 bytes of values where its header says 600 x 28 x 28 (470,400)"),
    "its header cut": (IMAGES, lambda raw: (raw / IMAGES).write_bytes(b"\0\0\x08\x03\0"),
                       "is 5 bytes, shorter than an IDX header"),
    "empty": (LABELS, lambda raw: (raw / LABELS).write_bytes(b""), "is empty"),
    "fewer labels": (LABELS, lambda raw: write_idx(raw / LABELS, np.zeros(10)),
                     f"holds 10 labels for the 600 images of {IMAGES}"),
    "a label out of range": (LABELS, lambda raw: write_idx(raw / LABELS, np.full(600, 10)),
                             "holds the label 10; MNIST's are 0 to 9"),
    "other images": (IMAGES, lambda raw: write_idx(raw / IMAGES, np.zeros((600, 32, 32))),
                     "holds images of 32x32, not MNIST's 28x28"),
    "a folder in its place": (IMAGES, lambda raw: replace_folder(raw / IMAGES),
                              "(Is a directory)"),
}
GZ_DAMAGES = {
    "truncated gzip": (lambda raw: (raw / f"{IMAGES}.gz").write_bytes(
        (raw / f"{IMAGES}.gz").read_bytes()[:300]), "is not a whole gzip file"),
    "not gzip": (lambda raw: (raw / f"{IMAGES}.gz").write_bytes(b"IDX? no"),
                 "is not a whole gzip file"),
    "a damaged header inside": (gzip_damaged, "it begins 00 00 0b 03, not 00 00 08 03"),
}


def read_fails(data_dir) -> str:
    """The one line of the DataError that reading MNIST in `data_dir` ends in."""
    dm = MNISTDataModule(data_dir=str(data_dir))
    with pytest.raises(DataError) as error:
        dm.prepare_data()
        dm.setup("fit")
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("damage", IDX_DAMAGES)
def test_a_damaged_idx_file_is_named_with_what_is_wrong(damage, tmp_path):
    name, write, said = IDX_DAMAGES[damage]
    raw = write_mnist(tmp_path) / "MNIST" / "raw"
    write(raw)
    message = read_fails(tmp_path)
    assert message.startswith(f"{raw / name} ") or f"read {raw / name} " in message
    assert said in message


@pytest.mark.parametrize("damage", GZ_DAMAGES)
def test_a_damaged_gz_file_is_named_and_nothing_is_unpacked_from_it(damage, tmp_path):
    write, said = GZ_DAMAGES[damage]
    raw = write_mnist(tmp_path, compress=True) / "MNIST" / "raw"
    write(raw)
    message = read_fails(tmp_path)
    assert message.startswith(f"{raw / IMAGES}.gz ") and said in message
    assert not (raw / IMAGES).exists()  # a damaged copy would then be blamed


def read_only(folder, monkeypatch):
    """Writes into `folder` refused, as on a read-only mount (root writes anywhere else)."""
    for method in ("write_bytes", "touch"):
        def refuse(path, *args, _real=getattr(Path, method), **kwargs):
            if path.parent == folder:
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return _real(path, *args, **kwargs)
        monkeypatch.setattr(Path, method, refuse)


def test_gz_files_in_a_folder_that_cannot_be_written_are_read_in_memory(tmp_path, monkeypatch):
    """The issue's example: a read-only folder of the four .gz files (as a system package ships
    them) was 'not a readable gzip file'."""
    plain = MNISTDataModule(str(write_mnist(tmp_path / "plain")))
    expected = plain.read("train")
    raw = write_mnist(tmp_path / "gz", compress=True) / "MNIST" / "raw"
    before = sorted(raw.iterdir())
    read_only(raw, monkeypatch)
    dm = MNISTDataModule(data_dir=str(tmp_path / "gz"), download=False)
    dm.prepare_data()
    images, labels = dm.read("train")
    assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
    assert sorted(raw.iterdir()) == before
    monkeypatch.undo()  # where it can be written, unpacked once
    dm.prepare_data()
    assert (raw / IMAGES).is_file() and torch.equal(dm.read("test")[1], plain.read("test")[1])


@pytest.mark.parametrize("module", [MNISTDataModule, CIFAR10DataModule])
def test_a_download_that_cannot_write_into_the_folder_says_so(module, tmp_path, monkeypatch):
    def download(dataset):  # as torchvision's fails in a folder of another user's
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path))

    monkeypatch.setattr(f"torchvision.datasets.{module.name.upper()}.download", download)
    with pytest.raises(DataError) as error:
        module(data_dir=str(tmp_path)).prepare_data()
    assert str(error.value).startswith(f"{tmp_path} cannot be written (Permission denied)")
    assert "download" in str(error.value) and "could not be downloaded" not in str(error.value)


def unreadable(file, monkeypatch):
    """Reading `file` refused, as for a file of another user's (root reads any)."""
    real = Path.read_bytes

    def read_bytes(path):
        if path == file:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


def test_a_data_file_that_cannot_be_read_is_named(tmp_path, monkeypatch):
    raw = write_mnist(tmp_path / "mnist") / "MNIST" / "raw"
    unreadable(raw / LABELS, monkeypatch)
    assert read_fails(tmp_path / "mnist") == f"cannot read {raw / LABELS} (Permission denied)"
    batch = write_cifar10(tmp_path / "cifar") / "cifar-10-batches-py" / "data_batch_3"
    unreadable(batch, monkeypatch)
    with pytest.raises(DataError, match=f"^cannot read {batch} \\(Permission denied\\)$"):
        CIFAR10DataModule(data_dir=str(tmp_path / "cifar")).read("train")


# --- CIFAR-10's pickles, as they are when their checksums are not torchvision's

def edit_batch(change):
    def damage(path):
        entry = pickle.loads(path.read_bytes(), encoding="latin1")
        change(entry)
        path.write_bytes(pickle.dumps(entry))
    return damage


CIFAR_DAMAGES = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:1000]),
                  "is not a whole pickle (UnpicklingError: pickle data was truncated)"),
    "not a pickle": (lambda p: p.write_bytes(b"a text file"), "is not a whole pickle"),
    "empty": (lambda p: p.write_bytes(b""), "is not a whole pickle (EOFError"),
    "a list": (lambda p: p.write_bytes(pickle.dumps([1, 2])),
               "is not a CIFAR-10 batch (a dict with 'data' and 'labels')"),
    # 96 x 3200 = 100 x 3072: reshaped without a word before, had the other files been alike
    "rows of another length": (edit_batch(lambda e: e.update(data=e["data"].reshape(96, 3200))),
                               "holds uint8 values of shape (96, 3200) as its 'data'"),
    "float images": (edit_batch(lambda e: e.update(data=e["data"].astype(np.float32))),
                     "holds float32 values of shape (100, 3072)"),
    "fewer labels": (edit_batch(lambda e: e.update(labels=e["labels"][:50])),
                     "holds 50 labels for its 100 images"),
    "a label out of range": (edit_batch(lambda e: e.update(labels=[12] * 100)),
                             "holds the label 12; CIFAR-10's are 0 to 9"),
    "a folder in its place": (replace_folder, "(Is a directory)"),
}


@pytest.mark.parametrize("damage", CIFAR_DAMAGES)
def test_a_damaged_cifar10_batch_is_named_with_what_is_wrong(damage, tmp_path):
    write, said = CIFAR_DAMAGES[damage]
    batch = write_cifar10(tmp_path) / "cifar-10-batches-py" / "data_batch_2"
    write(batch)
    dm = CIFAR10DataModule(data_dir=str(tmp_path))
    with pytest.raises(DataError) as error:
        dm.prepare_data()
        dm.setup("fit")
    message = str(error.value)
    assert "\n" not in message and str(batch) in message and said in message


def test_a_missing_cifar10_batch_is_named(tmp_path):
    (write_cifar10(tmp_path) / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DataError, match=r"CIFAR-10 is not whole in .*batches-py \(no data_batch_4"):
        CIFAR10DataModule(data_dir=str(tmp_path), download=False).prepare_data()


def test_a_damaged_header_on_the_command_line_is_one_line(tmp_path, monkeypatch, capsys):
    from conftest import run_train

    raw = write_mnist(tmp_path / "data") / "MNIST" / "raw"
    edit_header(2, 0x0A)(raw)
    monkeypatch.chdir(tmp_path)
    assert run_train(["--model", "mlp", "--data.data_dir", str(tmp_path / "data")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"train.py: error: {raw / IMAGES} is not an IDX file of 3-dimensional bytes: it begins "
        f"00 00 0a 03, not 00 00 08 03; replace it with a whole copy")



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
    from test_image_folder import ready, write_folder

    root = write_folder(tmp_path / "images", {"train": 40, "test": 8})
    expected = ready(root, tmp_path, image_size=16).read("train")[0]
    (cache,) = (tmp_path / "data" / "cache").glob("*-train-*.npy")
    CACHE_DAMAGES[damage](cache)
    images = ready(root, tmp_path, image_size=16, in_memory=False).read("train")[0]
    assert images.shape == expected.shape == (40, 3, 16, 16)  # as DiskImages, read from the file
    assert torch.equal(images.index_select(0, torch.arange(40)), expected)
    assert np.array_equal(np.load(cache), expected.numpy())  # and cached again, whole
