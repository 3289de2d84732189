"""`--data ImageFolderDataModule`: folders of image files written here, read through the real
module, decoder and CLI."""

import os
import struct
import zlib

import numpy as np
import pytest
import torch
from conftest import class_images, results, run_train, runs
from PIL import Image
from torchvision.datasets import ImageFolder

from datamodules import DataError, ImageFolderDataModule, image_folder
from datamodules.base import DeviceBatches, DiskImages
from datamodules.images import ImageFiles, decode

CLASSES = [
    "zebra",
    "ant",
    "moth",
    "cat",
]  # written in this order; numbered sorted, as ImageFolder does


def write_folder(root, splits=None, channels=3, size=16, ext="png", seed=0):
    """root/<split>/<class>/NNNN.<ext>: the learnable images of conftest, class k in CLASSES[k]."""
    for i, (split, n) in enumerate((splits or {"train": 160, "test": 40}).items()):
        images, labels = class_images(n, channels, size, num_classes=len(CLASSES), seed=seed + i)
        for j, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[..., 0] if channels == 1 else image).save(
                folder / f"{j:04d}.{ext}"
            )
    return root


def ready(root, tmp_path, **kwargs) -> ImageFolderDataModule:
    dm = ImageFolderDataModule(root=str(root), data_dir=str(tmp_path / "data"), **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


@pytest.fixture
def png_dir(tmp_path):
    return write_folder(tmp_path / "images")


def test_reads_a_png_folder_as_torchvision_imagefolder_does(png_dir, tmp_path):
    dm = ready(png_dir, tmp_path)
    reference = ImageFolder(str(png_dir / "test"))
    assert dm.classes == reference.classes == sorted(CLASSES)
    pixels = torch.from_numpy(
        np.stack([np.asarray(Image.open(p).convert("RGB")) for p, _ in reference.samples])
    )
    assert torch.equal(dm.splits["test"][0], pixels.permute(0, 3, 1, 2))
    assert dm.splits["test"][1].tolist() == reference.targets
    assert dm.image_shape == (3, 16, 16) and len(dm.splits["val"][0]) == 16  # a tenth of 160


def test_grey_images_are_one_channel_unless_told(tmp_path):
    write_folder(tmp_path / "grey", channels=1, ext="jpg")
    assert ready(tmp_path / "grey", tmp_path).image_shape == (1, 16, 16)
    assert ready(tmp_path / "grey", tmp_path, channels=3).image_shape == (3, 16, 16)
    write_folder(tmp_path / "colour", ext="jpg")
    assert ready(tmp_path / "colour", tmp_path, channels=1).image_shape == (1, 16, 16)


def test_images_of_other_sizes_need_image_size(png_dir, tmp_path):
    Image.new("RGB", (20, 12)).save(png_dir / "train" / "cat" / "wide.png")
    with pytest.raises(DataError, match="not all of one size; pass --data.image_size"):
        ready(png_dir, tmp_path)
    assert ready(png_dir, tmp_path, image_size=8).image_shape == (3, 8, 8)


def test_a_val_folder_is_the_validation_set(tmp_path):
    write_folder(tmp_path / "f", {"train": 80, "val": 20, "test": 20})
    dm = ready(tmp_path / "f", tmp_path)
    assert len(dm.splits["train"][0]) == 80 and len(dm.splits["val"][0]) == 20


def test_the_cache_is_read_the_second_time_and_rebuilt_when_a_file_changes(
    png_dir, tmp_path, monkeypatch
):
    first = ready(png_dir, tmp_path)
    cache = tmp_path / "data" / "cache"
    (train,) = cache.glob("image_folder-images-*-train-*.npy")
    assert torch.equal(
        torch.from_numpy(np.load(train)), first.read("train")[0]
    )  # numpy's own format
    assert not list(png_dir.rglob("*.npy"))  # the folder itself is left alone
    decoded = []
    real = image_folder.decode_files
    monkeypatch.setattr(image_folder, "decode_files", lambda *a: decoded.append(a) or real(*a))
    second = ready(png_dir, tmp_path)
    assert not decoded and torch.equal(second.splits["test"][0], first.splits["test"][0])
    Image.new("RGB", (16, 16), "red").save(png_dir / "test" / "cat" / "0000.png")
    third = ready(png_dir, tmp_path)
    assert len(decoded) == 1 and not torch.equal(third.splits["test"][0], first.splits["test"][0])
    assert len(list(cache.glob("*-test-*.npy"))) == 1  # the one of the files as they were is gone
    with open(
        train, "r+b"
    ) as file:  # as a run killed while writing would have left it, were it not renamed
        file.truncate(train.stat().st_size - 100)
    assert (
        torch.equal(ready(png_dir, tmp_path).read("train")[0], first.read("train")[0])
        and len(decoded) == 2
    )
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        p.name for p in cache.glob("*.npy")
    )  # no temporary


@pytest.mark.parametrize("in_memory", [True, False])
def test_statistics_do_not_depend_on_torchs_default_device(in_memory, png_dir, tmp_path):
    """Lightning calls configure_model, where the model asks the data for its statistics, with the
    training device as torch's default device; the images are counted on the host all the same.
    A GPU showed it; "meta" stands in for the GPU this machine lacks."""
    expected = ready(png_dir, tmp_path, in_memory=in_memory)
    dm = ready(png_dir, tmp_path, in_memory=in_memory)
    with torch.device("meta"):
        mean, std = dm.mean, dm.std
    assert (mean, std) == (expected.mean, expected.std) and 0 < min(std)


@pytest.mark.parametrize("channels", [3, 1])
def test_batches_from_disk_are_those_from_memory_and_resume_exactly(channels, tmp_path):
    write_folder(tmp_path / "f", channels=channels)
    options = {"crop_padding": 2, "flip": True, "batch_size": 16, "eval_batch_size": 7}
    memory, disk = (
        ready(tmp_path / "f", tmp_path, in_memory=where, **options) for where in (True, False)
    )
    assert isinstance(disk.read("train")[0], DiskImages) and not isinstance(
        memory.read("train")[0], DiskImages
    )
    assert disk.image_shape == memory.image_shape == (channels, 16, 16) and disk.std == memory.std

    def same(a, b):
        return len(a) == len(b) and all(
            torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q)
        )

    whole = list(memory.train_dataloader())
    assert same(list(disk.train_dataloader()), whole)
    assert same(list(disk.val_dataloader()), list(memory.val_dataloader()))
    assert same(list(disk.test_dataloader()), list(memory.test_dataloader()))
    for rank in (0, 1):  # DDP: each rank's share
        shards = [
            DeviceBatches(
                *dm.splits["train"], 16, train=True, flip=True, seed=3, rank=rank, world_size=2
            )
            for dm in (memory, disk)
        ]
        assert same(*map(list, shards))
    stopped = iter(disk.train_dataloader())
    next(stopped), next(stopped), next(stopped)
    resumed = ready(tmp_path / "f", tmp_path, in_memory=False, **options)
    resumed.load_state_dict(disk.state_dict())
    assert same(list(resumed.train_dataloader()), whole[3:])


def test_unwritable_cache_is_a_warning_not_an_error(png_dir, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").write_text("a file where the cache folder would be")
    with pytest.warns(UserWarning, match="could not write the image cache"):
        assert ready(png_dir, tmp_path).image_shape == (3, 16, 16)


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda root: (root / "train" / "cat" / "0001.png").write_bytes(b"not a png"),
            r"cannot read the image .*0001.png",
        ),
        (lambda root: __import__("shutil").rmtree(root / "test"), r"there is no folder .*test"),
        (lambda root: (root / "test" / "dog").mkdir(), r"test must have the same class folders"),
        (
            lambda root: [p.unlink() for p in (root / "train" / "ant").iterdir()],
            r"class folder .*ant has no image files",
        ),
    ],
)
def test_bad_folders_fail_with_a_clear_message(damage, message, png_dir, tmp_path):
    damage(png_dir)
    with pytest.raises(DataError, match=message):
        ready(png_dir, tmp_path)


@pytest.mark.slow
def test_worker_processes_decode_the_same_pixels(tmp_path):
    write_folder(
        tmp_path / "many", {"train": 600, "test": 20}
    )  # more than one batch of 256: worker processes
    dm = ready(tmp_path / "many", tmp_path)
    files, labels = dm.files("train")
    alone = torch.stack([ImageFiles(files, 3, None)[i][0] for i in range(len(files))])
    assert torch.equal(dm.read("train")[0], alone) and dm.read("train")[1].tolist() == labels


@pytest.mark.slow
def test_a_folder_larger_than_its_memory_budget_trains_from_disk(tmp_path):
    """1.8 GB of decoded images (6,000 JPEGs of 320x320, a few distinct files' bytes written
    again and again, as decoding costs the same) train with `--data.in_memory false`, and no
    process of the run holds half of them in its own memory."""
    import io
    import shutil
    import subprocess
    import sys

    from conftest import QUIET, ROOT, TRAIN

    root, n, size = tmp_path / "big", 6_000, 320
    try:
        for k, name in enumerate(CLASSES):
            image = Image.new("RGB", (size, size), (60 * k, 90, 200 - 40 * k))
            image.paste((230, 230, 230), (k * size // 4, 0, (k + 1) * size // 4, size // 4))
            image.save(jpeg := io.BytesIO(), "JPEG", quality=90)
            for split, count in (("train", n // 4), ("test", 16)):
                (root / split / name).mkdir(parents=True)
                for i in range(count):
                    (root / split / name / f"{i:05d}.jpg").write_bytes(jpeg.getvalue())
        decoded = (n + 4 * 16) * 3 * size * size
        args = ["--model", "quick_cnn", "--model.net.channels", "[6, 16, 16]",
                "--data", "ImageFolderDataModule", "--data.root", str(root),
                "--data.data_dir", str(tmp_path / "data"), "--data.in_memory", "false",
                "--data.batch_size", "8", "--data.eval_batch_size", "8",
                "--trainer.limit_train_batches", "20", "--trainer.limit_val_batches", "2",
                "--trainer.limit_test_batches", "2", *QUIET]
        with open(tmp_path / "output.txt", "wb") as output:
            process = subprocess.Popen([sys.executable, TRAIN, *args], cwd=tmp_path,
                                       stdout=output, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        peak = peak_anonymous_memory(process, deadline=400)
        assert process.wait() == 0, (tmp_path / "output.txt").read_text()[-3000:]
        (cache,) = (tmp_path / "data" / "cache").glob("*-train-*.npy")
        # the whole folder, decoded once
        assert np.load(cache, mmap_mode="r").shape == (n, 3, size, size)
        assert results(runs(tmp_path)[0])["metrics"]["test/acc"] is not None
        assert peak < decoded / 2, f"{peak / 1e9:.2f} GB held for {decoded / 1e9:.2f} GB of images"
    finally:
        # not kept as pytest keeps its last runs: it is gigabytes
        shutil.rmtree(tmp_path, ignore_errors=True)


def peak_anonymous_memory(process, deadline: float) -> int:
    """The most memory of its own (RssAnon, in bytes) that the process or one of its children held,
    sampled until it ends (killed after `deadline` seconds). Not the peak RSS: that counts the
    pages of files it maps (the cache it reads, the CUDA build's libraries: 1 GB before any
    image), which the system takes back when it needs them."""
    import time

    import psutil

    peak, parent, end = 0, psutil.Process(process.pid), time.time() + deadline
    while process.poll() is None:
        if time.time() > end:
            process.kill()
        try:
            pids = [parent.pid, *(child.pid for child in parent.children(recursive=True))]
            peak = max(peak, *(anonymous_memory(pid) for pid in pids))
        except (psutil.Error, OSError):  # a process that ended between the two looks
            pass
        time.sleep(0.05)
    return peak


def anonymous_memory(pid: int) -> int:
    """RssAnon of /proc/PID/status, in bytes (0 for a process that has ended: it has none)."""
    with open(f"/proc/{pid}/status") as status:
        lines = [line for line in status if line.startswith("RssAnon:")]
    return sum(int(line.split()[1]) * 1024 for line in lines)


def test_a_link_loop_and_links_to_other_classes_add_nothing(png_dir, tmp_path):
    plain = ready(png_dir, tmp_path).files("train")[1]
    (png_dir / "train" / "cat" / "up").symlink_to(
        ".."
    )  # a loop: os.walk(followlinks=True) reads cat again and again
    (png_dir / "train" / "moth" / "all").symlink_to(png_dir)  # the root, absolute
    (png_dir / "train" / "ant" / "cats").symlink_to(
        png_dir / "train" / "cat"
    )  # another class's images
    (png_dir / "test" / "ant" / "seen").symlink_to(
        png_dir / "train" / "ant" / "0000.png"
    )  # another split's
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.new("RGB", (16, 16)).save(outside / "new.png")
    (png_dir / "train" / "zebra" / "more").symlink_to(
        outside
    )  # images kept elsewhere: these are read
    dm = ImageFolderDataModule(root=str(png_dir), data_dir=str(tmp_path / "data"))
    files, labels = dm.files("train")
    zebra = sorted(CLASSES).index("zebra")
    assert np.bincount(labels).tolist() == [
        n + (i == zebra) for i, n in enumerate(np.bincount(plain))
    ]
    assert len(set(map(os.path.realpath, files))) == len(files) == 161
    assert len(dm.files("test")[0]) == 40


# --- every kind of image file becomes its 8-bit pixels, in training, predict and classify alike
# ----------------

RNG = np.random.default_rng(7)
WORDS = RNG.integers(0, 65536, (8, 8), dtype=np.uint16)


def png_16bit_rgb(path, words):
    """A 16-bit RGB PNG, which PIL cannot write: IHDR with bit depth 16, colour type 2."""
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in words)

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", words.shape[1], words.shape[0], 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def pgm(path, values, maxval):
    path.write_bytes(
        f"P5\n{values.shape[1]} {values.shape[0]}\n{maxval}\n".encode()
        + values.astype(">u2").tobytes()
    )


def transparent_glyph(path):
    rgba = np.zeros((8, 8, 4), dtype=np.uint8)
    rgba[2:6, 2:6, 3] = (
        255  # a black square on a transparent ground: dropping alpha would make it all black
    )
    Image.fromarray(rgba, "RGBA").save(path)
    expected = np.full((8, 8, 3), 255)
    expected[2:6, 2:6] = 0
    return expected


def palette_transparency(path):
    indices = np.tile(np.arange(4, dtype=np.uint8), (8, 2))
    image = Image.fromarray(indices, "P")
    colours = [(0, 0, 0), (200, 10, 10), (10, 200, 10), (10, 10, 200)]
    image.putpalette([c for colour in colours for c in colour])
    image.save(path, transparency=0)
    return np.array([(255, 255, 255), *colours[1:]])[indices]


def float_tiff(path):
    values = RNG.random((8, 8), dtype=np.float32)
    values[0, :3] = 0, 1, 0.5
    Image.fromarray(values).save(path)
    return np.floor(values * 255.999)


KINDS = {
    "16bit.png": (1, lambda p: Image.fromarray(WORDS).save(p) or WORDS >> 8),
    "16bit.tif": (1, lambda p: Image.fromarray(WORDS).save(p) or WORDS >> 8),
    "16bit.pgm": (1, lambda p: pgm(p, WORDS, 65535) or WORDS >> 8),
    "int32.tif": (1, lambda p: Image.fromarray(WORDS.astype(np.int32) << 15).save(p) or WORDS >> 8),
    "float.tif": (1, float_tiff),
    "rgb16.png": (
        3,
        lambda p: (
            png_16bit_rgb(p, np.stack([WORDS, WORDS.T, 65535 - WORDS], -1))
            or np.stack([WORDS, WORDS.T, 65535 - WORDS], -1) >> 8
        ),
    ),
    "glyph.png": (3, transparent_glyph),
    "palette.png": (3, palette_transparency),
    "cmyk.jpg": (
        3,
        lambda p: (
            Image.new("CMYK", (8, 8), (0, 255, 0, 0)).save(p, quality=100)
            or np.broadcast_to(np.array([255, 0, 255]), (8, 8, 3))
        ),
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_image_file_decodes_to_its_8bit_pixels(kind, tmp_path):
    channels, write = KINDS[kind]
    expected = write(path := tmp_path / kind)
    with Image.open(path) as image:
        pixels = np.asarray(decode(image, channels)).astype(int).reshape(8, 8, channels)
    assert np.abs(pixels - np.asarray(expected).reshape(8, 8, channels)).max() <= (
        2 if kind.endswith("jpg") else 0
    )
    image, error = ImageFiles([path], channels, (8, 8))[0]  # what predict reads files with
    assert error == "" and np.array_equal(image.permute(1, 2, 0).numpy(), pixels)


@pytest.mark.slow
def test_cli_fits_and_tests_on_an_image_folder(png_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                "cnn",
                "--data",
                "ImageFolderDataModule",
                "--data.root",
                str(png_dir),
                "--data.batch_size",
                "16",
                "--trainer.max_epochs",
                "2",
            ]
        )
        == 0
    )
    record = results(runs(tmp_path)[0])
    assert record["data"] == "image_folder" and record["metrics"]["test/acc"] is not None
    assert list(record["test/acc_per_class"]) == sorted(CLASSES)


def test_one_class_is_refused_before_training(png_dir, tmp_path):
    import shutil

    for split in ("train", "test"):
        for folder in sorted((png_dir / split).iterdir())[1:]:
            shutil.rmtree(folder)
    with pytest.raises(DataError, match="has 1 class folder"):
        ready(png_dir, tmp_path)
