"""The images people have: every format Pillow reads, files that are not images named when they are
skipped, a phone photo shown upright, in training (an image folder), predict and classify alike."""

import numpy as np
import pytest
import torch
from PIL import Image
from test_image_folder import ready, write_folder

from datamodules import image_folder
from datamodules.images import ImageFiles, decode, to_uint8_batch
from lit_models.predict import find_images

RNG = np.random.default_rng(3)
PIXELS = RNG.integers(0, 256, (16, 16, 3), dtype=np.uint8)
LOSSY = {".jpg", ".jpeg", ".jpe", ".jfif", ".mpo", ".avif", ".avifs"}  # the others keep every pixel


def written_formats(folder) -> dict[str, np.ndarray]:
    """PIXELS in every format Pillow can write (one file per extension) in `folder`: the pixels
    each file holds."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for ext, fmt in sorted(Image.registered_extensions().items()):
        path = folder / f"image{ext}"
        options = {"lossless": True} if fmt == "WEBP" else {}
        try:
            Image.fromarray(PIXELS).save(path, fmt, **options)
            with Image.open(path) as image:
                written[ext] = np.asarray(image.convert("RGB"))
        except Exception:  # a format Pillow writes no RGB images of (or only reads)
            path.unlink(missing_ok=True)
    (folder / "image.icns").unlink()  # an icon of 1024 x 1024: of another size than the rest
    del written[".icns"]
    return written


def test_every_format_pillow_writes_is_read_as_an_image(tmp_path):
    """torchvision's nine extensions were read; .gif, .jp2, .avif, .tga, .ico, .jfif and the rest
    were skipped without a word."""
    root = write_folder(tmp_path / "images")
    formats = written_formats(root / "train" / "cat")
    assert {".gif", ".jfif", ".jp2", ".tga", ".ico", ".qoi", ".apng"} <= set(formats)
    dm = ready(root, tmp_path)
    files, labels = dm.files("train")
    names = {f.name for f in files}
    assert {f"image{ext}" for ext in formats} <= names and len(files) == 160 + len(formats)
    images = dm.read("train")[0]
    for ext, pixels in formats.items():
        decoded = images[files.index(root / "train" / "cat" / f"image{ext}")]
        shown = decoded.permute(1, 2, 0).numpy()
        assert np.array_equal(shown, pixels), ext  # as Pillow shows it
        assert ext in LOSSY or np.array_equal(shown, PIXELS), ext


def test_files_that_are_not_images_are_named_once_skipped(tmp_path):
    root = write_folder(tmp_path / "images")
    cat = root / "train" / "cat"
    (cat / "notes.txt").write_text("taken on a Tuesday")
    (cat / "IMG_0001.heic").write_bytes(b"\0\0\0\x18ftypheic")  # no plug-in for it here
    (cat / "clip.mpg").write_bytes(b"\0\0\1\xb3" + bytes(20))  # Pillow reads its header only
    (cat / ".DS_Store").write_bytes(b"Bud1")  # hidden: neither read nor named
    (cat / "._0000.png").write_bytes(b"\0\5\26\7")  # a Mac's AppleDouble file: not a PNG
    with pytest.warns(UserWarning) as said:
        dm = ready(root, tmp_path)
    (line,) = [str(w.message) for w in said if "skipped" in str(w.message)]
    assert line == (f"skipped 3 files in {root} that are not images Pillow reads (by their "
                    f"extension): train/cat/IMG_0001.heic, train/cat/clip.mpg, train/cat/notes.txt")
    assert len(dm.files("train")[0]) == 160


def test_predict_inputs_name_what_they_skip(tmp_path, capsys):
    folder = tmp_path / "photos"
    formats = written_formats(folder)
    (folder / "list.csv").write_text("a,b\n")
    (folder / ".hidden.png").write_bytes(b"x")
    found = find_images([str(folder)])
    assert sorted(p.name for p in found) == sorted(f"image{ext}" for ext in formats)
    assert capsys.readouterr().err == ("train.py: skipped 1 files that are not images Pillow reads "
                                       f"(by their extension): {folder / 'list.csv'}\n")
    assert find_images([str(folder / "*.gif"), str(folder / "image.tga")]) == [
        folder / "image.gif", folder / "image.tga"]
    from lit_models import ModelError

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("")
    with pytest.raises(ModelError, match=r"docs: no image files that Pillow reads there, only "):
        find_images([str(tmp_path / "docs")])


# --- EXIF orientation: what a phone stores, and how a viewer shows it

STORED = RNG.integers(0, 256, (6, 10, 3), dtype=np.uint8)  # 10 wide, 6 high: a turn shows
TURNS = {  # the EXIF standard's eight orientations, by where the stored rows and columns go
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),  # a phone held upright: the stored image turned clockwise
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}


def phone_photo(path, orientation: int, fmt: str = "PNG") -> np.ndarray:
    """STORED with an EXIF orientation, as a phone writes it: the pixels a viewer shows."""
    image = Image.fromarray(STORED)
    exif = image.getexif()
    exif[0x0112] = orientation  # Orientation
    image.save(path, fmt, exif=exif, lossless=True, quality=95)  # options of WebP and JPEG
    if fmt != "JPEG":
        return TURNS[orientation](STORED)
    with Image.open(path) as stored:  # JPEG's pixels are not quite STORED's
        return TURNS[orientation](np.asarray(stored.convert("RGB")))


# Pillow turns a TIFF itself as it loads it: it must not be turned twice.
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
@pytest.mark.parametrize("orientation", TURNS)
def test_a_photo_is_shown_as_its_exif_orientation_says(orientation, fmt, tmp_path):
    shown = phone_photo(path := tmp_path / "photo", orientation, fmt)
    height, width = shown.shape[:2]
    with Image.open(path) as image:
        assert np.array_equal(np.asarray(decode(image, 3)), shown)  # as classify gets it
        batch = to_uint8_batch(image, (3, height, width))
    assert np.array_equal(batch[0].permute(1, 2, 0).numpy(), shown)
    image, error = ImageFiles([path], 3, (height, width))[0]  # as predict reads files
    assert error == "" and np.array_equal(image.permute(1, 2, 0).numpy(), shown)


def test_phone_photos_train_upright_and_an_old_cache_is_not_reused(tmp_path, monkeypatch):
    """In an image folder: each training image as shown. A cache decoded before orientation was
    applied has another name, and is decoded again."""
    root = write_folder(tmp_path / "images", size=10)
    for orientation in (6, 8):
        for i in range(10):
            phone_photo(root / "train" / "cat" / f"phone-{orientation}-{i}.png", orientation)
    options = {"image_size": 10}
    monkeypatch.setattr(image_folder, "DECODER_VERSION", 2)  # the pixels as the old decoder gave
    monkeypatch.setattr("datamodules.images.upright", lambda image: image)
    old = ready(root, tmp_path, **options)
    monkeypatch.undo()
    dm = ready(root, tmp_path, **options)
    files, _ = dm.files("train")
    for orientation in (6, 8):
        i = files.index(root / "train" / "cat" / f"phone-{orientation}-0.png")
        expected = resized(TURNS[orientation](STORED), 10)
        assert np.array_equal(dm.read("train")[0][i].permute(1, 2, 0).numpy(), expected)
        assert not torch.equal(old.read("train")[0][i], dm.read("train")[0][i])
    assert len(list((tmp_path / "data" / "cache").glob("*-train-*.npy"))) == 1


def resized(pixels: np.ndarray, size: int) -> np.ndarray:
    """What fitting to size x size makes of an image (the decoder's own resize, on the shown
    pixels)."""
    from datamodules.images import fit_image

    return fit_image(Image.fromarray(pixels), (3, size, size)).permute(1, 2, 0).numpy()


@pytest.mark.parametrize("channels", [1, 3])
def test_cielab_images_are_read_in_colour_and_in_grey(channels, tmp_path):
    """A CIELab TIFF (prepress, scanners): in grey, 'conversion from LAB to RGB not supported'."""
    lab = np.zeros((3, 4, 3), dtype=np.uint8)  # Pillow's a and b are signed bytes: 0 is grey
    lab[0, :, 0] = 255  # L 100: white
    lab[2] = 136, 80, 67  # L 53, a 80, b 67: sRGB's red
    Image.fromarray(lab, "LAB").save(path := tmp_path / "lab.tif")  # the middle row: L 0, black
    image, error = ImageFiles([path], channels, (3, 4))[0]
    assert error == ""
    white, black, red = image.permute(1, 2, 0).numpy().astype(int)
    assert (white >= 250).all() and (black <= 5).all()
    if channels == 3:
        assert (red[:, 0] >= 240).all() and (red[:, 1:] <= 15).all()
    else:  # ITU-R 601's luma of sRGB's red
        assert np.abs(red - 0.299 * 255).max() <= 4


def test_the_image_extensions_are_pillows_less_those_without_pixels():
    from datamodules.images import image_extensions

    extensions = image_extensions()
    assert {".jpg", ".png", ".gif", ".avif", ".jp2", ".tga", ".jfif", ".webp"} <= set(extensions)
    assert not {".pdf", ".mpg", ".h5", ".eps", ".wmf", ".txt"} & set(extensions)
    assert all(ext.startswith(".") and ext == ext.lower() for ext in extensions)
