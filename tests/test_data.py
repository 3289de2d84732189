"""Data modules and device batches: real torchvision readers, the cache, the split, batching, sharding."""

import pytest
import torch
from conftest import class_images, write_mnist

from datamodules import CIFAR10DataModule, DataSetupError, FashionMNISTDataModule, MNISTDataModule
from datamodules.base import channel_stats
from datamodules.device_batches import DeviceBatches, mix_seed, random_crop, random_flip


def test_cifar10_reads_torchvision_pickles_in_nchw(cifar10_dir):
    dm = CIFAR10DataModule(data_dir=str(cifar10_dir), val_size=100)
    dm.prepare_data()
    dm.setup("fit")
    images, labels = dm.splits["train"]
    assert images.dtype == torch.uint8 and images.shape == (400, 3, 32, 32)
    assert dm.splits["val"][0].shape == (100, 3, 32, 32) and dm.splits["test"][0].shape == (200, 3, 32, 32)
    # pixels as written: class k has its bright square in cell k of a 4x4 grid
    expected, expected_labels = class_images(700, 3, 32)
    assert torch.equal(dm.splits["test"][0], torch.from_numpy(expected[500:]).permute(0, 3, 1, 2))
    assert torch.equal(dm.splits["test"][1], torch.from_numpy(expected_labels[500:]))
    assert dm.image_shape == (3, 32, 32) and dm.num_classes == 10


@pytest.mark.parametrize("module, folder", [(MNISTDataModule, "MNIST"), (FashionMNISTDataModule, "FashionMNIST")])
def test_mnist_formats_read_by_torchvision(module, folder, tmp_path):
    write_mnist(tmp_path, folder=folder)
    dm = module(data_dir=str(tmp_path), val_size=50)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.splits["train"][0].shape == (550, 1, 28, 28)
    assert dm.splits["test"][0].shape == (200, 1, 28, 28)
    assert dm.image_shape == (1, 28, 28)


def test_gzipped_idx_files_are_extracted(tmp_path):
    # What a user does offline: drop the four .gz files into DIR/MNIST/raw/. Their md5 need not be the
    # originals' (Debian's Fashion-MNIST .gz files are re-compressed): no download is attempted.
    write_mnist(tmp_path, compress=True)
    dm = MNISTDataModule(data_dir=str(tmp_path), val_size=50)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.splits["test"][0].shape == (200, 1, 28, 28)


def test_split_is_seeded_disjoint_and_from_training_data(mnist_dir):
    def split(seed):
        dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, split_seed=seed)
        dm.setup("fit")
        return dm

    a, b, c = split(0), split(0), split(1)
    assert torch.equal(a.splits["val"][0], b.splits["val"][0])
    assert not torch.equal(a.splits["val"][0], c.splits["val"][0])
    train = {bytes(x.numpy()) for x in a.splits["train"][0]}
    val = {bytes(x.numpy()) for x in a.splits["val"][0]}
    assert len(train) + len(val) == 600 and not train & val  # noise makes every image unique
    test = {bytes(x.numpy()) for x in a.splits["test"][0]}
    assert not test & (train | val)


def test_second_setup_reads_the_cache_not_the_source(mnist_dir, monkeypatch):
    first = MNISTDataModule(data_dir=str(mnist_dir), val_size=100)
    first.prepare_data()
    assert (mnist_dir / "cache" / "mnist-train.pt").is_file()
    monkeypatch.setattr(MNISTDataModule, "decode", lambda self, split: pytest.fail("decoded again"))
    second = MNISTDataModule(data_dir=str(mnist_dir), val_size=100)
    second.setup("fit")
    assert torch.equal(second.splits["test"][0], first.load_split("test")["images"])


def test_cache_is_rebuilt_when_the_source_changes(mnist_dir):
    MNISTDataModule(data_dir=str(mnist_dir)).prepare_data()
    write_mnist(mnist_dir, train=700)  # new files: other sizes
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100)
    dm.setup("fit")
    assert len(dm.splits["train"][0]) == 600


def test_truncated_cache_is_rebuilt(mnist_dir):
    MNISTDataModule(data_dir=str(mnist_dir)).prepare_data()
    cache = mnist_dir / "cache" / "mnist-train.pt"
    cache.write_bytes(cache.read_bytes()[:1000])
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100)
    dm.setup("fit")
    assert len(dm.splits["train"][0]) == 500


def test_channel_stats_match_a_direct_computation():
    images = torch.randint(0, 256, (300, 3, 8, 8), dtype=torch.uint8)
    mean, std = channel_stats(images, chunk=64)
    x = images.double() / 255
    assert torch.allclose(mean.double(), x.mean((0, 2, 3)), atol=1e-6)
    assert torch.allclose(std.double(), x.std((0, 2, 3), correction=0), atol=1e-6)


def test_missing_data_without_download_names_the_files(tmp_path):
    dm = MNISTDataModule(data_dir=str(tmp_path), download=False)
    with pytest.raises(DataSetupError, match="train-images-idx3-ubyte"):
        dm.prepare_data()


def test_batch_size_larger_than_the_data_is_a_clear_error(mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=1000)
    dm.setup("fit")
    with pytest.raises(DataSetupError, match="batch_size 1000 is larger than the 500 training images"):
        dm.train_dataloader()


# --- DeviceBatches ---------------------------------------------------------------------------------

def batches(n=100, batch_size=16, **kwargs):
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous()
    labels = torch.arange(n)
    return DeviceBatches(images, labels, batch_size, torch.zeros(1), torch.ones(1) / 255, **kwargs)


def test_each_iter_is_a_fresh_epoch_with_its_own_order():
    loader = batches(shuffle=True)
    assert len(loader) == 6  # 100 // 16, full batches only
    loader.set_epoch(0)
    first = torch.cat([y for _, y in loader])
    second = torch.cat([y for _, y in loader])  # same epoch number: same order
    loader.set_epoch(1)
    third = torch.cat([y for _, y in loader])
    assert len(first) == 96 and len(set(first.tolist())) == 96
    assert torch.equal(first, second) and not torch.equal(first, third)


def test_images_are_normalised_and_match_labels():
    loader = batches(shuffle=True)
    for x, y in loader:
        assert x.dtype == torch.float32
        assert torch.equal(x[:, 0, 0, 0], y.float())  # image i holds the value i; mean 0, std 1/255


def test_evaluation_covers_every_sample_once_in_order():
    loader = batches(n=100, batch_size=30)
    assert len(loader) == 4
    assert torch.equal(torch.cat([y for _, y in loader]), torch.arange(100))


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_shards_are_disjoint_and_equally_long(world_size):
    train = [batches(shuffle=True, rank=r, world_size=world_size) for r in range(world_size)]
    seen = [torch.cat([y for _, y in loader]) for loader in train]
    assert len({len(loader) for loader in train}) == 1
    assert len({len(s) for s in seen}) == 1
    all_seen = torch.cat(seen)
    assert len(set(all_seen.tolist())) == len(all_seen)
    evaluation = [batches(n=100, batch_size=7, rank=r, world_size=world_size) for r in range(world_size)]
    assert sorted(torch.cat([y for loader in evaluation for _, y in loader]).tolist()) == list(range(100))


def test_random_crop_shifts_within_the_padding():
    images = torch.zeros(64, 1, 8, 8, dtype=torch.uint8)
    images[:, :, 3, 3] = 255
    out = random_crop(images, 2, torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    rows, cols = (out[:, 0] == 255).nonzero()[:, 1:].T
    assert rows.min() >= 1 and rows.max() <= 5 and cols.min() >= 1 and cols.max() <= 5
    assert len(set(zip(rows.tolist(), cols.tolist()))) > 10  # many offsets, not one for the batch
    assert (out == 255).sum() == 64  # the pixel is never cropped away at this padding


def test_random_flip_mirrors_about_half():
    images = torch.arange(8, dtype=torch.uint8).view(1, 1, 1, 8).expand(1000, 1, 2, 8)
    out = random_flip(images, torch.Generator().manual_seed(0))
    flipped = (out[:, 0, 0, 0] == 7).float().mean()
    assert 0.4 < flipped < 0.6
    assert torch.equal(out[out[:, 0, 0, 0] == 7], images.flip(3)[out[:, 0, 0, 0] == 7])


def train_labels(dm) -> torch.Tensor:
    """The labels of one training epoch, in order, through the chunks Lightning is handed."""
    return torch.cat([y for chunk in dm.train_dataloader() for _, y in chunk])


def test_the_seed_argument_drives_the_order(mnist_dir):
    def order(seed):
        dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, seed=seed)
        dm.setup("fit")
        return train_labels(dm)

    assert torch.equal(order(3), order(3)) and not torch.equal(order(3), order(4))
    # seeds up to 2^32 (and --seed_everything true picks one up to that) and beyond do not overflow
    big = order(2**32 - 1)
    assert len(big) == 500 and not torch.equal(big, order(2**32 - 2))


def test_mix_seed_fits_a_generator_for_any_input():
    seeds = {mix_seed(s, e, i, r) for s in (0, 20000, 2**32 - 1, 2**64 - 1)
             for e in (0, 1) for i in (0, 7) for r in (0, 1)}
    assert len(seeds) == 32 and all(0 <= s < 2**63 for s in seeds)
    torch.Generator().manual_seed(max(seeds))  # accepted


def test_chunks_hold_steps_per_call_batches_and_cover_the_epoch(mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, steps_per_call=4)
    dm.setup("fit")
    chunks = list(dm.train_dataloader())
    assert [len(c) for c in chunks] == [4, 4, 2] and len(dm.train_dataloader()) == 3  # 10 batches an epoch
    one = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, steps_per_call=1)
    one.setup("fit")
    for a, b in zip([batch for chunk in chunks for batch in chunk], [next(iter(c)) for c in one.train_dataloader()]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # the same batches, whatever the chunking


def test_chunks_make_their_batches_only_as_they_are_trained_on(mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, steps_per_call=4)
    dm.setup("fit")
    every = [batch for chunk in dm.train_dataloader() for batch in chunk]
    chunks = iter(dm.train_dataloader())
    first, second = next(chunks), next(chunks)  # Lightning fetches the next call's chunk ahead of time
    assert first.cursor.position == 0  # nothing made yet: one batch's memory at a time, not K
    x, y = next(iter(first))  # a stop after the first step: the rest of the chunk is never trained on
    assert first.cursor.position == 1 and torch.equal(x, every[0][0])
    assert [torch.equal(b[1], e[1]) for b, e in zip(second, every[4:8])] == [True] * 4  # still batches 4-7
    assert first.images == 50 and second.images == 200


def test_steps_per_call_keeps_whole_accumulation_groups(mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, steps_per_call=3,
                         accumulate_grad_batches=2)
    dm.setup("fit")
    assert dm.train_dataloader().steps_per_call == 4


def test_a_resumed_epoch_starts_at_the_next_batch(mnist_dir):
    dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, steps_per_call=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    loader.set_epoch(1)
    everything = [batch for chunk in loader for batch in chunk]
    loader = dm.train_dataloader()
    loader.set_epoch(1)
    it = iter(loader)
    next(it), next(it)  # 4 batches trained, then the run stopped
    state = dm.state_dict()
    resumed = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, steps_per_call=2)
    resumed.setup("fit")
    resumed.load_state_dict(state)
    loader = resumed.train_dataloader()
    loader.set_epoch(1)
    rest = [batch for chunk in loader for batch in chunk]
    assert len(rest) == 6 and all(torch.equal(a[0], b[0]) for a, b in zip(rest, everything[4:]))


def test_classic_dataloader_path_gives_the_same_images(mnist_dir):
    fast = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, eval_batch_size=64)
    classic = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, eval_batch_size=64, on_device=False,
                              num_workers=0, batch_size=50)
    fast.setup("fit")
    classic.setup("fit")
    a = torch.cat([x for x, _ in fast.test_dataloader()])
    b = torch.cat([x for x, _ in classic.test_dataloader()])
    assert torch.allclose(a, b, atol=1e-5)
    (x, y), *_ = next(iter(classic.train_dataloader()))
    assert x.shape == (50, 1, 28, 28) and classic.train_dataloader().num_steps == 10


@pytest.mark.parametrize("workers", [0, 2])
def test_classic_path_augments_each_sample_the_same_whatever_the_workers_and_resumes(mnist_dir, workers):
    def module():
        dm = MNISTDataModule(data_dir=str(mnist_dir), val_size=100, batch_size=50, on_device=False, num_workers=workers,
                             crop_padding=2, flip=True, steps_per_call=3, seed=5)
        dm.setup("fit")
        return dm

    reference = module()
    reference.num_workers = 0
    loader = reference.train_dataloader()
    loader.set_epoch(2)
    everything = [x for chunk in loader for x, _ in chunk]
    dm = module()
    loader = dm.train_dataloader()
    loader.set_epoch(2)
    first = next(iter(loader))
    assert all(torch.equal(a, b) for (a, _), b in zip(first, everything))
    state = dm.state_dict()
    resumed = module()
    resumed.load_state_dict(state)
    loader = resumed.train_dataloader()
    loader.set_epoch(2)
    rest = [x for chunk in loader for x, _ in chunk]
    assert len(rest) == 7 and all(torch.equal(a, b) for a, b in zip(rest, everything[3:]))
