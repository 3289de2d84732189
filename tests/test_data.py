"""Data modules and device batches: the real torchvision readers, the split, statistics, batching,
sharding."""

import pickle
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import class_images, write_mnist

from datamodules import (
    CIFAR10DataModule,
    DataError,
    DeviceBatches,
    FashionMNISTDataModule,
    MNISTDataModule,
)
from datamodules.augment import random_crop, random_flip
from datamodules.base import channel_stats
from lit_common.seeds import mix_seed


def test_cifar10_reads_torchvision_pickles_in_nchw_and_hashes_each_file_once_a_read(
    cifar10_dir, monkeypatch
):
    """The real torchvision class reads the files when their checksums are the originals' (here
    every hash says so); it hashes them as it is made, and nothing hashes them again."""
    from torchvision.datasets import CIFAR10

    genuine = dict([*CIFAR10.train_list, *CIFAR10.test_list])
    genuine[CIFAR10.meta["filename"]] = CIFAR10.meta["md5"]
    hashed = []

    def calculate_md5(path, *args, **kwargs):
        hashed.append(Path(path).name)
        return genuine[Path(path).name]

    monkeypatch.setattr("torchvision.datasets.utils.calculate_md5", calculate_md5)
    dm = CIFAR10DataModule(data_dir=str(cifar10_dir), val_size=100)
    dm.prepare_data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not the warning of a copy read as it is
        dm.setup("fit")
        dm.setup("test")
    assert Counter(hashed) == {name: 2 for name in genuine}  # a read of the training and test sets
    assert (
        dm.splits["train"][0].dtype == torch.uint8
        and dm.splits["train"][0].shape == (400, 3, 32, 32)
    )
    assert dm.splits["val"][0].shape == (100, 3, 32, 32)
    expected, labels = class_images(700, 3, 32)  # as written: class k is a bright square in cell k
    assert torch.equal(dm.splits["test"][0], torch.from_numpy(expected[500:]).permute(0, 3, 1, 2))
    assert torch.equal(dm.splits["test"][1], torch.from_numpy(labels[500:]))


def test_a_cifar10_copy_with_other_checksums_is_read_as_it_is_with_a_warning(cifar10_dir):
    dm = CIFAR10DataModule(data_dir=str(cifar10_dir))
    dm.prepare_data()  # the files are there: no download is tried, offline or not
    with pytest.warns(UserWarning, match="differ from torchvision's checksums; read as they are"):
        images, labels = dm.read("test")
    assert images.shape == (200, 3, 32, 32)
    assert torch.equal(
        images, torch.from_numpy(class_images(700, 3, 32)[0][500:]).permute(0, 3, 1, 2)
    )


def test_a_damaged_cifar10_file_is_named(cifar10_dir):
    batch = cifar10_dir / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(batch.read_bytes()[:500])
    with pytest.raises(DataError, match="test_batch is not a whole pickle .*replace it"):
        CIFAR10DataModule(data_dir=str(cifar10_dir)).read("test")
    batch.write_bytes(pickle.dumps({"nothing": 1}))
    with pytest.raises(DataError, match="test_batch is not a CIFAR-10 batch"):
        CIFAR10DataModule(data_dir=str(cifar10_dir)).read("test")


@pytest.mark.parametrize(
    "module, folder", [(MNISTDataModule, "MNIST"), (FashionMNISTDataModule, "FashionMNIST")]
)
@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_gzipped_or_not(module, folder, compress, tmp_path):
    # Offline, a user drops the four files (gzipped as Debian ships them, or not) into
    # DIR/<folder>/raw/.
    write_mnist(tmp_path, folder=folder, compress=compress)
    dm = module(data_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    assert dm.splits["train"][0].shape == (540, 1, 28, 28) and dm.splits["val"][0].shape == (
        60,
        1,
        28,
        28,
    )
    dm.setup("test")
    assert dm.splits["test"][0].shape == (200, 1, 28, 28)


def test_missing_data_offline_says_where_to_put_which_files(tmp_path):
    with pytest.raises(DataError, match="could not be downloaded .*train-images-idx3-ubyte"):
        MNISTDataModule(data_dir=str(tmp_path / "data")).prepare_data()  # no network here
    with pytest.raises(DataError, match="download is false"):
        MNISTDataModule(data_dir=str(tmp_path), download=False).prepare_data()


@pytest.mark.parametrize(
    "val_size, val", [(None, 60), (100, 100), (100.0, 100), (0.25, 150), (0, 0)]
)
def test_validation_split_size(val_size, val, mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=val_size)
    dm.setup("fit")
    assert len(dm.splits["train"][0]) == 600 - val
    assert dm.has_validation == (val > 0) and len(dm.splits.get("val", ((),))[0]) == val


def test_a_tenth_for_validation_at_most_5000():
    dm = MNISTDataModule()
    dm.read = lambda split: (
        torch.zeros(60000, 1, 1, 1, dtype=torch.uint8),
        torch.zeros(60000, dtype=torch.long),
    )
    dm.setup("fit")
    assert len(dm.splits["val"][0]) == 5000


def test_split_is_seeded_disjoint_and_from_training_data(mnist_dir):
    def split(seed):
        dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, split_seed=seed)
        dm.setup("fit")
        dm.setup("test")
        return dm

    a, b, c = split(0), split(0), split(1)
    assert torch.equal(a.splits["val"][0], b.splits["val"][0])
    assert not torch.equal(a.splits["val"][0], c.splits["val"][0])
    train, val, test = (
        {bytes(x.numpy()) for x in a.splits[s][0]} for s in ("train", "val", "test")
    )
    assert len(train) + len(val) == 600 and not train & val and not test & (train | val)


def test_bad_sizes_are_refused(mnist_dir):
    with pytest.raises(DataError, match="batch_size 0"):
        MNISTDataModule(data_dir=str(mnist_dir), batch_size=0)
    dm = MNISTDataModule(data_dir=str(mnist_dir), batch_size=1000)
    with pytest.raises(DataError, match="batch_size 1000 is more than the 540 training images"):
        dm.train_dataloader()
    with pytest.raises(DataError, match="val_size 600 leaves none"):
        MNISTDataModule(data_dir=str(mnist_dir), val_size=600).setup("fit")
    with pytest.raises(
        DataError, match="val_size 2.5: a count of images, or a fraction between 0 and 1"
    ):
        MNISTDataModule(data_dir=str(mnist_dir), val_size=2.5)


def test_channel_stats_are_exact():
    images = torch.randint(0, 256, (5000, 3, 8, 8), dtype=torch.uint8)
    mean, std = channel_stats(images)
    x = images.double() / 255
    assert torch.allclose(torch.tensor(mean, dtype=torch.float64), x.mean((0, 2, 3)), atol=1e-9)
    assert torch.allclose(
        torch.tensor(std, dtype=torch.float64), x.std((0, 2, 3), correction=0), atol=1e-9
    )


# --- DeviceBatches
# -----------------------------------------------------------------------------------------------


def batches(n=100, batch_size=16, **kwargs):
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous()
    return DeviceBatches(images, torch.arange(n), batch_size, **kwargs)


def epoch(loader, e):
    loader.set_epoch(e)
    return [y.tolist() for _, y in loader]


def test_training_epochs_are_full_batches_in_a_seeded_order():
    loader = batches(train=True, seed=3)
    first, again, second = epoch(loader, 0), epoch(loader, 0), epoch(loader, 1)
    assert len(first) == len(loader) == 6 and all(len(b) == 16 for b in first)
    assert first == again and first != second
    assert epoch(batches(train=True, seed=4), 0) != first
    assert len({i for b in first for i in b}) == 96
    assert epoch(batches(train=True, shuffle=False), 0) == [
        list(range(i, i + 16)) for i in range(0, 96, 16)
    ]


def test_images_match_their_labels_and_evaluation_sees_every_image_once_in_order():
    for x, y in batches():
        assert torch.equal(x[:, 0, 0, 0].long(), y)
    assert [i for b in epoch(batches(), 0) for i in b] == list(range(100))


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_shards(world_size):
    shards = [
        epoch(batches(train=True, rank=r, world_size=world_size), 5) for r in range(world_size)
    ]
    assert len({len(s) for s in shards}) == 1  # the same number of steps on every rank
    seen = [i for s in shards for b in s for i in b]
    assert len(seen) == len(set(seen))
    evaluated = [
        i
        for r in range(world_size)
        for b in epoch(batches(rank=r, world_size=world_size), 0)
        for i in b
    ]
    assert sorted(evaluated) == list(range(100))


def test_a_resumed_epoch_starts_at_the_next_batch():
    loader = batches(train=True, seed=1, crop_padding=1, flip=True)
    loader.set_epoch(2)
    whole = [(x.clone(), y.clone()) for x, y in loader]
    loader.set_epoch(2)
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    assert state == {"epoch": 2, "batches": 2}
    resumed = batches(train=True, seed=1, crop_padding=1, flip=True)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    rest = list(resumed)
    assert len(rest) == 4 and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, whole[2:])
    )
    resumed.set_epoch(3)
    assert len(list(resumed)) == 6  # the next epoch is whole


def test_random_crop_shifts_within_the_padding_and_flip_mirrors_about_half():
    images = torch.arange(64, dtype=torch.uint8).view(1, 1, 8, 8).expand(200, 1, 8, 8).contiguous()
    generator = torch.Generator().manual_seed(0)
    cropped = random_crop(images, 2, generator)
    assert cropped.shape == images.shape
    for image in (
        cropped
    ):  # each is the original shifted by (dy, dx) in [-2, 2], zeros where it left the frame
        shifts = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if torch.equal(image, torch.roll(images[0], (dy, dx), (1, 2)) * shifted_mask(dy, dx))
        ]
        assert shifts
    flipped = random_flip(images, generator)
    mirrored = sum(torch.equal(f, images[0].flip(2)) for f in flipped)
    assert 70 < mirrored < 130 and mirrored + sum(torch.equal(f, images[0]) for f in flipped) == 200


def shifted_mask(dy: int, dx: int) -> torch.Tensor:
    mask = torch.ones(1, 8, 8, dtype=torch.uint8)
    if dy > 0:
        mask[:, :dy] = 0
    elif dy < 0:
        mask[:, dy:] = 0
    if dx > 0:
        mask[:, :, :dx] = 0
    elif dx < 0:
        mask[:, :, dx:] = 0
    return mask


def test_mix_seed_fits_a_generator_for_any_input():
    for values in [(0,), (2**64 - 1, 10**6, 3), (-1, 5)]:
        torch.Generator().manual_seed(mix_seed(*values))
    assert mix_seed(0, 1) != mix_seed(1, 0)
