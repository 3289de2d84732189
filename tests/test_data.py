"""Data modules and device batches: the real torchvision readers, the split, statistics, batching,
sharding."""

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import class_images, results, run_train, runs, write_cifar10, write_mnist

from datamodules import (
    CIFAR10DataModule,
    DataError,
    DeviceBatches,
    FashionMNISTDataModule,
    MNISTDataModule,
)
from datamodules.augment import mix_seed, random_crop, random_flip
from datamodules.base import channel_stats
from lit_models import ImageClassifier, LastCheckpoint


def no_download(*args, **kwargs):
    raise AssertionError("a download was tried")


def test_cifar10_pickles_are_read_as_they_are_in_nchw(cifar10_dir, monkeypatch):
    """The pickles, read as they are: a copy whose md5 sums are not torchvision's (CI's, written
    by ../shared/datasets/cifar10_jpeg.py) is read without a word, and nothing is downloaded."""
    monkeypatch.setattr("datamodules.cifar10.download_and_extract_archive", no_download)
    dm = CIFAR10DataModule(data_dir=str(cifar10_dir), val_size=100)
    dm.prepare_data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.setup("fit")
        dm.setup("test")
    train, val = dm.splits["train"][0], dm.splits["val"][0]
    assert train.dtype == torch.uint8 and train.shape == (400, 3, 32, 32)
    assert val.shape == (100, 3, 32, 32)
    expected, labels = class_images(700, 3, 32)  # as written: class k is a bright square in cell k
    assert torch.equal(dm.splits["test"][0], torch.from_numpy(expected[500:]).permute(0, 3, 1, 2))
    assert torch.equal(dm.splits["test"][1], torch.from_numpy(labels[500:]))


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


def offline(*args, **kwargs):
    """torchvision's download on a machine without a network (as this one is, but certainly)."""
    raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried mirror, got:\n"
                       "<urlopen error [Errno -3] Temporary failure in name resolution>")


def test_missing_data_offline_says_where_to_put_which_files(tmp_path, monkeypatch):
    monkeypatch.setattr("torchvision.datasets.MNIST.download", offline)
    monkeypatch.setattr("datamodules.cifar10.download_and_extract_archive", offline)
    with pytest.raises(DataError) as error:
        MNISTDataModule(data_dir=str(tmp_path / "data")).prepare_data()
    assert str(error.value) == (
        f"MNIST is not in {tmp_path / 'data' / 'MNIST' / 'raw'} and could not be downloaded "
        f"(<urlopen error [Errno -3] Temporary failure in name resolution>). Put its four IDX "
        f"files there, gzipped or not: train-images-idx3-ubyte, train-labels-idx1-ubyte, "
        f"t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, or pass --data.data_dir with the "
        f"folder that holds it")
    with pytest.raises(DataError, match="download is false"):
        MNISTDataModule(data_dir=str(tmp_path), download=False).prepare_data()
    with pytest.raises(DataError, match=r"^CIFAR-10 is not whole in .* could not be downloaded "
                                        r"\(<urlopen .*\)\. Put cifar-10-python.tar.gz \(from "
                                        r"https://www.cs.toronto.edu/\S+\), or its extracted "
                                        r"cifar-10-batches-py/, in "):
        CIFAR10DataModule(data_dir=str(tmp_path)).prepare_data()


def test_a_missing_cifar10_batch_is_named(tmp_path):
    (write_cifar10(tmp_path) / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DataError, match=r"CIFAR-10 is not whole in .*batches-py \(no data_batch_4"):
        CIFAR10DataModule(data_dir=str(tmp_path), download=False).prepare_data()


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


# --- a fit resumed where its checkpoint's position would mean other images: refused in one line
# -----------------------------------------------------------------------------------------------

QUIET = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}


def fit(data, folder: Path, ckpt_path=None, **trainer) -> L.Trainer:
    """ImageClassifier's MLP fitted on `data` from Python, with folder/checkpoints/last.ckpt at
    every third step too."""
    trainer = L.Trainer(default_root_dir=folder, callbacks=[LastCheckpoint(every_n_train_steps=3)],
                        **QUIET, **trainer)
    trainer.fit(ImageClassifier("mlp"), datamodule=data, ckpt_path=ckpt_path)
    return trainer


@pytest.fixture(scope="module")
def mid_epoch(tmp_path_factory) -> tuple[Path, Path]:
    """A data folder with MNIST and Fashion-MNIST, and an MNIST checkpoint in the middle of its
    first epoch: after batch 3 of 8 (540 training images, batches of 64)."""
    folder = tmp_path_factory.mktemp("mid_epoch")
    data = write_mnist(folder / "data")
    write_mnist(data, folder="FashionMNIST")
    fit(MNISTDataModule(str(data), batch_size=64), folder, max_steps=3)
    return data, folder / "checkpoints" / "last.ckpt"


RESUMED_ON = {
    "another data set": (FashionMNISTDataModule, {}, "holds no position in the batches of "
                         "FashionMNISTDataModule: it was saved by a fit on other data"),
    "another batch size mid-epoch": (MNISTDataModule, {"batch_size": 32}, (
        "was saved mid-epoch (batch 3 of 8) in batches of 64 on 1 process(es), not 32 on 1: "
        "resume it with --data.batch_size 64, or start a new run")),
    "another validation split": (MNISTDataModule, {"val_size": 100}, (
        "was saved on 540 training images of MNISTDataModule, not 500 of MNISTDataModule: "
        "resume it with the data and --data.val_size it was saved with, or start a new run")),
}


@pytest.mark.parametrize("change", RESUMED_ON)
def test_a_resume_whose_position_means_other_images_is_refused(change, mid_epoch, tmp_path):
    """Lightning's own hooks: the same from Python as from train.py (defect 5 of issue 56)."""
    data, checkpoint = mid_epoch
    module, options, said = RESUMED_ON[change]
    with pytest.raises(DataError) as error:
        fit(module(str(data), **{"batch_size": 64, **options}), tmp_path, checkpoint, max_steps=6)
    assert str(error.value).startswith(f"{checkpoint} {said}") and "\n" not in str(error.value)


def test_the_same_data_resumes_and_an_older_checkpoint_is_not_refused(mid_epoch, tmp_path):
    data, checkpoint = mid_epoch
    assert fit(MNISTDataModule(str(data), batch_size=64), tmp_path, checkpoint,
               max_steps=6).global_step == 6
    # A checkpoint of a version that saved the position alone: what it means is unknown, and
    # the fit goes on (with another batch size too).
    older = torch.load(checkpoint, weights_only=True)
    older["MNISTDataModule"] = {"train_batches": older["MNISTDataModule"]["train_batches"]}
    torch.save(older, tmp_path / "older.ckpt")
    assert fit(MNISTDataModule(str(data), batch_size=32), tmp_path, tmp_path / "older.ckpt",
               max_steps=6).global_step == 6


def test_on_the_command_line_another_data_set_is_refused_and_a_batch_size_at_an_epochs_end_applies(
    tmp_path, monkeypatch, capsys
):
    data = write_mnist(tmp_path / "data")
    write_mnist(data, folder="FashionMNIST")
    monkeypatch.chdir(tmp_path)
    assert run_train(["--model", "mlp", "--data.data_dir", str(data), "--trainer.max_epochs", "1",
                      "--data.batch_size", "64"]) == 0
    (run,) = runs(tmp_path)
    before = (run / "results.json").read_text()
    capsys.readouterr()
    assert run_train(["--ckpt_path", "last", "--data", "FashionMNISTDataModule"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        f"train.py: error: {run / 'checkpoints' / 'last.ckpt'} holds no position in the batches "
        f"of FashionMNISTDataModule: it was saved by a fit on other data; resume it with the "
        f"--data it was saved with, or start a new run")
    assert (run / "results.json").read_text() == before
    # At the end of an epoch, another batch size is no other position: it applies.
    assert run_train(["--ckpt_path", "last", "--data.batch_size", "32",
                      "--trainer.max_epochs", "2"]) == 0
    assert results(run)["global_step"] == 8 + 540 // 32 and results(run)["epochs"] == 2


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
