"""The data cache: checked on every load and rebuilt when damaged."""

import warnings
from pathlib import Path

import pytest
import torch

from datamodules import MNISTDataModule, cache


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
