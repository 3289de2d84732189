"""`--data image_folder`: folders of PNG and JPEG files written here, read through the real module and CLI."""

import os
import re
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, class_images
from helpers import results, run_dirs, run_inprocess
from PIL import Image
from torchvision.datasets import ImageFolder

from datamodules import DataSetupError, ImageFolderDataModule, image_folder

# Written in this order; the module must number them as ImageFolder does, sorted.
CLASSES = ["zebra", "ant", "moth", "cat"]


def write_folder(root, splits=None, channels=3, size=16, ext="png", seed=0):
    """root/<split>/<class>/NNNN.<ext>: the learnable images of conftest, class k in CLASSES[k]."""
    for i, (split, n) in enumerate((splits or {"train": 160, "test": 40}).items()):
        images, labels = class_images(n, channels, size, num_classes=len(CLASSES), seed=seed + i)
        for j, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[..., 0] if channels == 1 else image).save(folder / f"{j:04d}.{ext}")
    return root


def module(root, tmp_path, **kwargs) -> ImageFolderDataModule:
    return ImageFolderDataModule(root=str(root), data_dir=str(tmp_path / "data"), **kwargs)


def ready(root, tmp_path, **kwargs) -> ImageFolderDataModule:
    dm = module(root, tmp_path, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def as_read_by_pil(dataset: ImageFolder, mode: str) -> torch.Tensor:
    arrays = [np.asarray(Image.open(path).convert(mode)).reshape(16, 16, -1) for path, _ in dataset.samples]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def snapshot(root) -> dict:
    """Every path under root with its bytes (or link target): to show that nothing was changed or deleted."""
    def content(p):
        return os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None

    return {str(p.relative_to(root)): content(p) for p in sorted(root.rglob("*"))}


@pytest.fixture
def png_dir(tmp_path):
    return write_folder(tmp_path / "images")


def test_reads_a_png_folder_as_torchvision_imagefolder_does(png_dir, tmp_path):
    dm = ready(png_dir, tmp_path)
    reference = ImageFolder(str(png_dir / "test"))
    assert dm.classes == reference.classes == sorted(CLASSES) and dm.num_classes == 4
    assert dm.image_shape == (3, 16, 16)
    test_images, test_labels = dm.splits["test"]
    assert test_images.dtype == torch.uint8
    assert torch.equal(test_labels, torch.tensor(reference.targets))
    assert torch.equal(test_images, as_read_by_pil(reference, "RGB"))
    # no val/ folder: a seeded tenth of train validates
    assert not dm.has_validation_split
    assert len(dm.splits["val"][0]) == 16 and len(dm.splits["train"][0]) == 144
    assert len(dm.mean) == 3 and 0.2 < sum(dm.mean) / 3 < 0.5  # from the pixels: noise 0..89, squares 230


def test_grey_jpegs_are_detected_as_one_channel(tmp_path):
    root = write_folder(tmp_path / "grey", channels=1, ext="jpg")
    dm = ready(root, tmp_path)
    assert dm.image_shape == (1, 16, 16)
    reference = ImageFolder(str(root / "test"))
    assert torch.equal(dm.splits["test"][0], as_read_by_pil(reference, "L"))
    # told otherwise: three (equal) channels
    rgb = ready(root, tmp_path, channels=3)
    assert rgb.image_shape == (3, 16, 16)
    assert torch.equal(rgb.splits["test"][0], dm.splits["test"][0].expand(-1, 3, -1, -1))


def test_colour_jpegs_stay_rgb_unless_told(tmp_path):
    root = write_folder(tmp_path / "colour", ext="jpeg")
    root_image = next((root / "train" / "ant").iterdir())
    Image.open(root_image).convert("RGB").save(root_image, quality=95)  # one more re-encoded JPEG
    assert ready(root, tmp_path).image_shape == (3, 16, 16)
    grey = ready(root, tmp_path, channels=1)
    assert grey.image_shape == (1, 16, 16)
    assert torch.equal(grey.splits["test"][0], as_read_by_pil(ImageFolder(str(root / "test")), "L"))


def test_images_of_other_sizes_need_image_size(png_dir, tmp_path):
    big = png_dir / "train" / "cat" / "big.png"
    Image.fromarray(np.full((40, 24, 3), 200, dtype=np.uint8)).save(big)  # 24 wide, 40 high
    with pytest.raises(DataSetupError, match=re.escape(f"{big} is 24x40 pixels") + ".*--data.image_size"):
        _ = module(png_dir, tmp_path).image_shape
    dm = ready(png_dir, tmp_path, image_size=12)
    assert dm.image_shape == (3, 12, 12)
    assert dm.splits["test"][0].shape == (40, 3, 12, 12)
    # the shorter side scaled to 12, then the middle 12x12: a uniform image stays uniform
    assert (dm.load_split("train")["images"] == 200).all((1, 2, 3)).sum() == 1


def test_a_val_folder_is_the_validation_set(tmp_path):
    root = write_folder(tmp_path / "images", {"train": 120, "val": 30, "test": 20})
    dm = ready(root, tmp_path)
    assert dm.has_validation_split
    assert len(dm.splits["train"][0]) == 120 and len(dm.splits["val"][0]) == 30  # all of train trains
    assert torch.equal(dm.splits["val"][0], as_read_by_pil(ImageFolder(str(root / "val")), "RGB"))


def test_second_setup_reads_the_cache_outside_the_folder(png_dir, tmp_path, monkeypatch):
    before = snapshot(png_dir)
    first = ready(png_dir, tmp_path)
    assert snapshot(png_dir) == before  # nothing written into the user's folder
    cache = sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "data" / "cache").iterdir())
    assert cache == ["test.pt", "train.pt"]
    monkeypatch.setattr(ImageFolderDataModule, "decode", lambda self, split: pytest.fail("decoded again"))
    second = ready(png_dir, tmp_path)
    assert second.image_shape == (3, 16, 16)
    assert torch.equal(second.splits["test"][0], first.splits["test"][0])


def test_cache_is_rebuilt_when_a_file_changes_or_appears(png_dir, tmp_path):
    first = ready(png_dir, tmp_path)
    changed = ImageFolder(str(png_dir / "test")).samples[0][0]
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(changed)
    second = ready(png_dir, tmp_path)
    assert second.splits["test"][0][0].sum() == 0 and first.splits["test"][0][0].sum() > 0
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(png_dir / "test" / "ant" / "new.png")
    assert len(ready(png_dir, tmp_path).splits["test"][0]) == 41


def test_folders_with_the_same_name_get_their_own_caches(tmp_path):
    a = write_folder(tmp_path / "a" / "images", seed=0)
    b = write_folder(tmp_path / "b" / "images", seed=5)
    assert not torch.equal(ready(a, tmp_path).splits["test"][0], ready(b, tmp_path).splits["test"][0])
    assert len(list((tmp_path / "data" / "cache").iterdir())) == 4


def test_worker_processes_decode_the_same_pixels(png_dir, tmp_path, monkeypatch):
    serial = ready(png_dir, tmp_path)
    monkeypatch.setattr(image_folder, "CHUNK", 7)  # several chunks: a pool of processes decodes them
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    spawned = []
    real_pool = image_folder.ProcessPoolExecutor
    monkeypatch.setattr(image_folder, "ProcessPoolExecutor",
                        lambda n, **kwargs: spawned.append(n) or real_pool(n, **kwargs))
    pooled = ready(png_dir, tmp_path / "other")
    assert spawned == [2, 2]
    for split in ("train", "val", "test"):
        assert torch.equal(pooled.splits[split][0], serial.splits[split][0])
    # a broken file found by a worker is still named
    broken = max((png_dir / "test" / "moth").iterdir())
    broken.write_bytes(broken.read_bytes()[:60])
    with pytest.raises(DataSetupError, match=re.escape(f"cannot read the image {broken}")):
        ready(png_dir, tmp_path / "other")


def test_non_image_files_are_ignored_with_a_count(png_dir, tmp_path):
    (png_dir / "train" / "ant" / "notes.txt").write_text("hello")
    (png_dir / "train" / "cat" / ".DS_Store").write_bytes(b"\0")
    (png_dir / "train" / "README").write_text("my images")
    (png_dir / "train" / ".ipynb_checkpoints").mkdir()  # a hidden folder is not a class
    with pytest.warns(UserWarning, match=r"ignored 3 files in .*train that are not images"):
        dm = ready(png_dir, tmp_path)
    assert dm.classes == sorted(CLASSES) and len(dm.splits["train"][0]) + len(dm.splits["val"][0]) == 160


# --- the command line ----------------------------------------------------------------------------

def test_cli_fits_and_tests_on_an_image_folder(png_dir, in_tmp):
    code = run_inprocess(["--model", "mlp", "--data", "image_folder", "--data.root", str(png_dir),
                          "--trainer.max_epochs=3", "--data.batch_size=16"])
    assert code == 0
    res = results(run_dirs(in_tmp)[0])
    assert (res["model"], res["data"], res["test_samples"]) == ("mlp", "image_folder", 40)
    assert res["test/acc"] > 0.6  # learnable data: chance is 0.25
    assert list(res["test/acc_per_class"]) == sorted(CLASSES)
    state = torch.load(res["checkpoint"], weights_only=True)["state_dict"]
    assert state["net.fc1.weight"].shape[1] == 3 * 16 * 16  # the input shape follows the data
    assert any(p.name.startswith("image_folder-images-") for p in (in_tmp / "data" / "cache").iterdir())


def test_cnn_recipe_brings_its_batch_size_but_not_cifar10s_augmentation(png_dir, in_tmp, capsys):
    # `--data image_folder` after `--model cnn` keeps the recipe's batch size; flips are the data set's choice.
    assert run_inprocess(["--model", "cnn", "--data", "image_folder", "--data.root", str(png_dir),
                          "--print_config"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)["data"]
    assert data["class_path"] == "datamodules.ImageFolderDataModule"
    assert {k: data["init_args"][k] for k in ("batch_size", "crop_padding", "flip")} == \
        {"batch_size": 128, "crop_padding": 0, "flip": False}


def break_missing_train(root):
    (root / "train").rename(root / "training")
    return "there is no folder .*/train"


def break_empty_class(root):
    for f in (root / "test" / "moth").iterdir():
        f.rename(root / f"moth-{f.name}")
    return "class folder .*test/moth has no images"


def break_test_classes(root):
    (root / "test" / "cat").rename(root / "test" / "dog")
    return "test must have the same class folders as .*train; missing: cat; not in train: dog"


def break_an_image(root):
    (root / "train" / "ant" / "broken.png").write_bytes(b"not a png at all")
    return "cannot read the image .*train/ant/broken.png"


def truncate_a_jpeg(root):
    path = next((root / "test" / "zebra").iterdir())
    Image.open(path).convert("RGB").save(root / "test" / "zebra" / "cut.jpg")
    data = (root / "test" / "zebra" / "cut.jpg").read_bytes()
    (root / "test" / "zebra" / "cut.jpg").write_bytes(data[: len(data) // 2])
    return r"cannot read the image .*test/zebra/cut.jpg \(OSError: "


def dangle_a_link(root):
    (root / "train" / "cat" / "gone.png").symlink_to(root / "nowhere.png")
    return "cannot read the image .*train/cat/gone.png: it is not a file"


@pytest.mark.parametrize("damage", [break_missing_train, break_empty_class, break_test_classes,
                                    break_an_image, truncate_a_jpeg, dangle_a_link])
def test_bad_folders_fail_with_a_clear_message_and_delete_nothing(damage, png_dir, in_tmp, capsys):
    message = damage(png_dir)
    before = snapshot(png_dir)
    code = run_inprocess(["--model", "mlp", "--data", "image_folder", "--data.root", str(png_dir),
                          "--trainer.max_epochs=1", "--data.batch_size=16"])
    err = capsys.readouterr().err
    assert code == 1, err
    ours = [line for line in err.splitlines() if line.startswith("train.py:")]  # not Lightning's INFO lines
    assert len(ours) == 1 and ours[0].startswith("train.py: error: ") and "Traceback" not in err
    assert re.search(message, err), err
    assert snapshot(png_dir) == before


# --- every kind of image file becomes sane 8-bit pixels ---------------------------------------------

RNG = np.random.default_rng(7)
WORDS = RNG.integers(0, 65536, (8, 8), dtype=np.uint16)  # 16-bit values over the whole range


def png_16bit_rgb(path, words: np.ndarray):
    """A 16-bit RGB PNG, which PIL cannot write: IHDR with bit depth 16, colour type 2."""
    height, width, _ = words.shape
    rows = b"".join(b"\0" + words[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))


def pgm(path, values: np.ndarray, maxval: int):
    path.write_bytes(f"P5\n{values.shape[1]} {values.shape[0]}\n{maxval}\n".encode() + values.astype(">u2").tobytes())


def grey_16bit_png(path):
    Image.fromarray(WORDS).save(path := path.with_suffix(".png"))
    return path, "L", WORDS >> 8


def grey_16bit_tiff(path):
    Image.fromarray(WORDS).save(path := path.with_suffix(".tif"))
    return path, "L", WORDS >> 8


def grey_16bit_pgm(path):  # PIL opens it as "I"
    pgm(path := path.with_suffix(".pgm"), WORDS, 65535)
    return path, "L", WORDS >> 8


def grey_10bit_pgm(path):  # PIL scales maxval 1023 to 65535; 1023 must still be white
    values = WORDS >> 6
    pgm(path := path.with_suffix(".pgm"), values, 1023)
    return path, "L", np.round(values / 1023 * 255)


def int32_tiff(path):
    values = RNG.integers(0, 2**31, (8, 8), dtype=np.int32)
    Image.fromarray(values).save(path := path.with_suffix(".tiff"))
    return path, "L", values >> 23  # torchvision's ToDtype(uint8, scale=True) of int32


def float_tiff(path):
    values = RNG.random((8, 8), dtype=np.float32)
    values[0, :3] = 0, 1, 0.5
    Image.fromarray(values).save(path := path.with_suffix(".tif"))
    return path, "L", np.floor(values * 255.999)


def rgb_16bit_png(path):
    words = np.stack([WORDS, WORDS[::-1], 65535 - WORDS], axis=-1)
    png_16bit_rgb(path := path.with_suffix(".png"), words)
    return path, "RGB", words >> 8


def grey_alpha_png(path):  # shown over white: v * a + 255 * (1 - a)
    grey, alpha = (WORDS >> 8).astype(np.uint8), RNG.integers(0, 256, (8, 8), dtype=np.uint8)
    Image.fromarray(np.stack([grey, alpha], -1), "LA").save(path := path.with_suffix(".png"))
    return path, "L", grey * (alpha / 255) + 255 * (1 - alpha / 255)


def black_glyph_on_transparent_png(path):  # dropping alpha would make it all black
    rgba = np.zeros((8, 8, 4), dtype=np.uint8)
    rgba[2:6, 2:6, 3] = 255
    Image.fromarray(rgba, "RGBA").save(path := path.with_suffix(".png"))
    expected = np.full((8, 8, 3), 255)
    expected[2:6, 2:6] = 0
    return path, "RGB", expected


def palette_with_transparency_png(path):
    indices = np.tile(np.arange(4, dtype=np.uint8), (8, 2))
    image = Image.fromarray(indices, "P")
    colours = [(0, 0, 0), (200, 10, 10), (10, 200, 10), (10, 10, 200)]
    image.putpalette([c for colour in colours for c in colour])
    image.save(path := path.with_suffix(".png"), transparency=0)  # index 0 (black) is transparent
    return path, "RGB", np.array([(255, 255, 255), *colours[1:]])[indices]


def grey_with_transparent_level_png(path):
    grey = (WORDS >> 8).astype(np.uint8)
    grey[0, 0] = 0
    Image.fromarray(grey).save(path := path.with_suffix(".png"), transparency=0)
    return path, "L", np.where(grey == 0, 255, grey)


def cmyk_jpeg(path):
    Image.new("CMYK", (8, 8), (0, 255, 0, 0)).save(path := path.with_suffix(".jpg"), quality=100)
    return path, "RGB", np.broadcast_to(np.array([255, 0, 255]), (8, 8, 3))  # magenta


def bilevel_png(path):
    board = (np.indices((8, 8)).sum(0) % 2).astype(bool)
    Image.fromarray(board).save(path := path.with_suffix(".png"))
    return path, "L", board * 255


@pytest.mark.parametrize("write", [grey_16bit_png, grey_16bit_tiff, grey_16bit_pgm, grey_10bit_pgm, int32_tiff,
                                   float_tiff, rgb_16bit_png, grey_alpha_png, black_glyph_on_transparent_png,
                                   palette_with_transparency_png, grey_with_transparent_level_png, cmyk_jpeg,
                                   bilevel_png])
def test_every_kind_of_image_file_decodes_to_its_8bit_pixels(write, tmp_path):
    path, mode, expected = write(tmp_path / "image")
    image, note = image_folder.open_image(path, mode)
    assert image.mode == mode and note == ""
    pixels = np.asarray(image).astype(int)
    # exact, but for rounding in the compositing and scaling PIL does, and in JPEG's colour conversion
    tolerance = 2 if path.suffix == ".jpg" else 1 if write in (grey_alpha_png, grey_10bit_pgm) else 0
    assert np.abs(pixels - expected).max() <= tolerance
    if mode == "L":  # the same pixels in the three channels when RGB is asked for
        assert np.array_equal(np.asarray(image_folder.open_image(path, "RGB")[0]), np.stack([pixels] * 3, -1))


def test_high_bit_depth_modes_scale_and_say_what_was_clipped():
    # PIL opens files in these modes too; the TIFF-less ones are 16 bits (PGM, PNG before Pillow 10.4)
    for image in (Image.fromarray(WORDS), Image.fromarray(WORDS.astype(">u2")), Image.fromarray(WORDS).convert("I")):
        assert image.mode in ("I;16", "I;16B", "I")
        grey, note = image_folder.to_8bit(image)
        assert np.array_equal(np.asarray(grey), WORDS >> 8) and note == ""
    floats = np.array([[-0.5, 0.0, 0.25, 1.0, 3.0, np.nan]], dtype=np.float32)
    grey, note = image_folder.to_8bit(Image.fromarray(floats))
    assert np.asarray(grey).tolist() == [[0, 0, 63, 255, 255, 0]] and note.startswith("float values -0.5..3")
    negative = np.array([[-70000, 0, 65535]], dtype=np.int32)
    grey, note = image_folder.to_8bit(Image.fromarray(negative))
    assert np.asarray(grey).tolist() == [[0, 0, 255]] and note == "16-bit values -70000..65535"


def test_sixteen_bit_and_float_files_keep_their_pixels_through_the_module(tmp_path):
    # The learnable images, each split written in turn in every format that holds grey: the module must
    # read back the 8-bit originals (v * 257 >> 8 == v, v / 255 * 255.999 -> v, v << 23 >> 23 == v).
    writers = {
        ".png": lambda p, v: Image.fromarray(v).save(p),
        "16.png": lambda p, v: Image.fromarray(v.astype(np.uint16) * 257).save(p),
        "16.tif": lambda p, v: Image.fromarray(v.astype(np.uint16) * 257).save(p),
        "32.tif": lambda p, v: Image.fromarray(v.astype(np.int32) << 23).save(p),
        "f.tif": lambda p, v: Image.fromarray(v.astype(np.float32) / 255).save(p),
        "16.pgm": lambda p, v: pgm(p, v.astype(np.uint16) * 257, 65535),
    }
    root, originals = tmp_path / "grey", {}
    for i, (split, n) in enumerate({"train": 60, "test": 30}.items()):
        images, labels = class_images(n, 1, 16, num_classes=len(CLASSES), seed=i)
        for j, (image, label) in enumerate(zip(images[..., 0], labels)):
            suffix = list(writers)[j % len(writers)]
            path = root / split / CLASSES[label] / f"{j:04d}{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            writers[suffix](path, image)
            originals[path] = image
    dm = module(root, tmp_path, val_size=6)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.image_shape == (1, 16, 16)  # still found to be grey
    expected = np.stack([originals[path] for path in dm.source_files("test")])
    assert torch.equal(dm.splits["test"][0][:, 0], torch.from_numpy(expected))
    # values a float file cannot mean are clipped, with a warning that names one
    Image.fromarray(np.full((16, 16), 3.5, dtype=np.float32)).save(root / "test" / "ant" / "bright.tif")
    with pytest.warns(UserWarning, match=r"1 images in .*test have values outside .*bright.tif \(float values 3.5"):
        module(root, tmp_path, val_size=6).load_split("test")


def test_sixteen_bit_rgb_files_read_as_their_8bit_twins(png_dir, tmp_path):
    twins = []
    for path in sorted((png_dir / "test" / "cat").iterdir())[:4]:
        pixels = np.asarray(Image.open(path).convert("RGB"))
        path.unlink()
        low_bytes = RNG.integers(0, 256, pixels.shape)  # must not matter
        png_16bit_rgb(path, pixels.astype(np.uint16) * 256 + low_bytes)
        twins.append(pixels.copy())
    dm = ready(png_dir, tmp_path)
    read = dict(zip(dm.source_files("test"), dm.splits["test"][0]))
    paths = sorted((png_dir / "test" / "cat").iterdir())[:4]
    for path, pixels in zip(paths, twins):
        assert torch.equal(read[path], torch.from_numpy(pixels).permute(2, 0, 1))


# --- links in the folders ----------------------------------------------------------------------------

def counts(dm) -> list[int]:
    """Images per class in the training files, as listed."""
    return np.bincount(dm._list("train")[1], minlength=len(CLASSES)).tolist()


def test_a_link_loop_does_not_multiply_the_images(png_dir, tmp_path):
    plain = counts(module(png_dir, tmp_path))
    (png_dir / "train" / "cat" / "up").symlink_to("..")  # the loop of the issue: cat read 40 times
    deep = png_dir / "train" / "ant" / "deep"
    deep.mkdir()
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(deep / "extra.png")
    (deep / "again").symlink_to("..")  # a loop back to the class folder, two levels down
    (png_dir / "train" / "moth" / "all").symlink_to(png_dir)  # the root, absolute
    dm = module(png_dir, tmp_path)
    with pytest.warns(UserWarning, match=r"did not read 3 links in .*train again: .*a loop.*: "
                                         r".*train/ant/deep/again -> .*train/ant, .*train/cat/up -> .*train, "
                                         r".*train/moth/all -> .*images$"):
        files = dm.source_files("train")
    ant = sorted(CLASSES).index("ant")
    assert counts(dm) == [n + (i == ant) for i, n in enumerate(plain)]
    assert len(set(map(os.path.realpath, files))) == len(files) == 161
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.splits["train"][0]) + len(dm.splits["val"][0]) == 161


def test_links_to_images_read_elsewhere_are_not_read_again(png_dir, tmp_path):
    plain = module(png_dir, tmp_path)
    plain_files, plain_labels = plain._list("train")
    train = png_dir / "train"
    (train / "ant" / "moths").symlink_to("../moth")  # a sibling class: its images stay moths
    zebra = sorted((train / "zebra").iterdir())[0]
    (train / "cat" / "striped.png").symlink_to(zebra)  # one file
    (train / "cat" / "exam").symlink_to(png_dir / "test" / "cat")  # test images in train
    elsewhere = write_folder(tmp_path / "elsewhere", {"more": 8}, seed=9) / "more" / "cat"
    (train / "cat" / "more").symlink_to(elsewhere)  # images kept elsewhere: read, once
    (png_dir / "test" / "cat" / "more").symlink_to(elsewhere)  # ...and not again in test
    dm = module(png_dir, tmp_path)
    with pytest.warns(UserWarning) as caught:
        files, labels = dm._list("train")  # every split is listed at once
    cat = sorted(CLASSES).index("cat")
    more = [train / "cat" / "more" / p.name for p in sorted(elsewhere.iterdir())]
    # as ImageFolder orders them (by folder, then name), the linked images under cat, the others unchanged
    expected = sorted(zip(plain_labels + [cat] * len(more), plain_files + more),
                      key=lambda x: (x[0], str(x[1].parent), x[1].name))
    assert list(zip(labels, files)) == expected
    train_warning, test_warning = (str(w.message) for w in caught if "did not read" in str(w.message))
    assert re.search(r"did not read 3 links in .*train again", train_warning)
    assert all(f"{link} -> " in train_warning for link in ("ant/moths", "cat/striped.png", "cat/exam"))
    assert re.search(r"did not read 1 links in .*test again: .*test/cat/more -> .*elsewhere/more/cat$", test_warning)
    assert len(dm._list("test")[0]) == 40


# --- signals while the worker processes decode -------------------------------------------------------

# Decodes root/train slowly (50 ms an image, 2 s a task of 40, 4 workers: ~6 s in all), and says what
# stopped it, and when.
SLOW_DECODE = """
import os, sys, time
from datamodules import ImageFolderDataModule, image_folder
real_open = image_folder.open_image
def slow_open(path, mode):
    time.sleep(0.05)
    return real_open(path, mode)
image_folder.open_image = slow_open  # the forked workers inherit it
image_folder.CHUNK = 40
os.sched_getaffinity = lambda pid: {0, 1, 2, 3}  # four workers, however many cores
try:
    ImageFolderDataModule(root=sys.argv[1], data_dir=sys.argv[2]).load_split("train")
except BaseException as e:
    print(type(e).__name__, time.time(), flush=True)
    raise
"""


def children(pid: int) -> list[int]:
    """The live (not zombie) child processes of `pid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["Ctrl-C", "SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_while_decoding_stops_at_once_and_leaves_no_worker(how, tmp_path):
    root = write_folder(tmp_path / "images", {"train": 400, "test": 4})
    child = subprocess.Popen([sys.executable, "-c", SLOW_DECODE, str(root), str(tmp_path / "data")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers = []
    try:
        deadline = time.time() + 60
        while len(workers) < 4 and time.time() < deadline and child.poll() is None:
            time.sleep(0.05)
            workers = children(child.pid)
        assert len(workers) == 4, child.stderr.read() if child.poll() is not None else "no workers"
        time.sleep(0.5)  # in the middle of their tasks
        sent = time.time()
        if how == "Ctrl-C":
            os.killpg(child.pid, signal.SIGINT)  # a terminal sends it to the whole process group
        else:
            os.kill(child.pid, getattr(signal, how))  # `kill`, a scheduler, the OOM killer: the main process
        code = child.wait(timeout=15)
        exited = time.time() - sent
        deadline = time.time() + 3  # SIGKILL: the workers are told by the kernel; it takes a moment
        while any(map(alive, workers)) and time.time() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if alive(pid)], "workers outlived the main process"
    finally:
        for pid in [child.pid, *workers]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        child.wait()
    out = child.stdout.read().split()
    if how == "SIGKILL":
        assert code == -signal.SIGKILL
    else:  # the exception reaches the caller at once, not after the tasks running or queued (seconds)
        assert out[0] == ("SIGTERMException" if how == "SIGTERM" else "KeyboardInterrupt")
        assert float(out[1]) - sent < 1.0
        assert code in ((143, -signal.SIGTERM) if how == "SIGTERM" else (-signal.SIGINT, 1))
    assert exited < 8  # most of it the interpreter's exit with torch loaded (~1 s here)


def test_a_worker_that_dies_is_a_clear_error(png_dir, tmp_path, monkeypatch):
    main, real_open = os.getpid(), image_folder.open_image

    def killed(path, mode):  # what the OOM killer does to a worker
        if os.getpid() != main:
            os._exit(137)
        return real_open(path, mode)

    monkeypatch.setattr(image_folder, "open_image", killed)
    monkeypatch.setattr(image_folder, "CHUNK", 7)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(DataSetupError, match="a process decoding the images died"):
        ready(png_dir, tmp_path)
