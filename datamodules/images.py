"""Image files as uint8 tensors: one decoder for training on a folder, predicting files and
`model.classify`.

Every format Pillow reads (by its registered extensions), as a viewer shows it: turned upright as
its EXIF orientation says (a phone stores a photo as its sensor saw it), 16- and 32-bit integer
images scaled by their bit depth (65535 -> 255, as torchvision's `ToDtype(torch.uint8,
scale=True)` does), float images read as 0..1 (clipped), CIELab ones through RGB, and transparent
pixels over white (PIL's own `convert` clips 16-bit values and drops transparency).
"""

import functools
import os
from pathlib import Path

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

# The formats Pillow registers extensions for but gives no pixels of: it only writes PDF and Palm
# files, reads only the header of an MPEG video or of the stub formats (which need a handler of
# the user's), and renders EPS through Ghostscript, which few machines have.
NO_PIXELS = {"PDF", "PALM", "MPEG", "BUFR", "GRIB", "HDF5", "WMF", "EPS"}
# Listed by name when files are skipped; the rest are counted.
NAMED = 5
# Part of an image cache's name: raised whenever decoding gives other pixels (3: EXIF orientation
# applied), so that a cache of the old ones is decoded again, not read.
DECODER_VERSION = 3


@functools.cache
def image_extensions() -> tuple[str, ...]:
    """The extensions of image files: those Pillow registers for a format it reads, and
    torchvision's ImageFolder's."""
    registered = Image.registered_extensions()  # imports Pillow's plug-ins, once
    readable = {ext for ext, fmt in registered.items() if fmt not in NO_PIXELS}
    return tuple(sorted(readable | set(IMG_EXTENSIONS)))


def is_image(name: str) -> bool:
    """Whether a file name has the extension of an image Pillow reads."""
    return name.lower().endswith(image_extensions())


def some(paths: list[Path], root: Path | None = None) -> str:
    """The first few of `paths` (relative to `root`), and how many more: for one line."""
    shown = paths[:NAMED]
    if root is not None:
        shown = [path.relative_to(root) for path in shown]
    line = ", ".join(map(str, shown))
    if len(paths) > NAMED:
        line += f" and {len(paths) - NAMED} more"
    return line


def to_8bit(image: Image.Image) -> Image.Image:
    """A high-bit-depth image ("I;16...", "I", "F") as an 8-bit grey ("L") image."""
    values = np.asarray(image)
    if image.mode == "F":
        out = np.clip(np.nan_to_num(values.astype(np.float64), nan=0.0), 0, 1) * (256 - 1e-3)
        return Image.fromarray(out.astype(np.uint8), "L")
    # 16: what PNG, PGM (scaled by PIL) and 16-bit TIFFs hold; a TIFF says how many bits it has
    # (its tag 258, one per sample); 32 bits: PIL's int32, scaled as torchvision does
    bits = min(int(np.ravel(getattr(image, "tag_v2", {}).get(258, 16))[0]), 31)
    values = np.clip(values.astype(np.int64), 0, 2 ** bits - 1) >> (bits - 8)
    return Image.fromarray(values.astype(np.uint8), "L")


def upright(image: Image.Image) -> Image.Image:
    """`image` turned as its EXIF orientation says; itself, not a copy, when it says nothing."""
    if image.getexif().get(ExifTags.Base.Orientation, 1) == 1:
        return image
    return ImageOps.exif_transpose(image)


def decode(image: Image.Image, channels: int) -> Image.Image:
    """`image` as a viewer shows it, in 8-bit grey (channels 1) or RGB (channels 3)."""
    image = upright(image)
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        image = to_8bit(image)
    elif image.mode == "LAB":  # Pillow converts CIELab to RGB, not to grey
        image = image.convert("RGB")
    elif image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    mode = "L" if channels == 1 else "RGB"
    if image.mode != mode:
        image = image.convert(mode)
    return image


def fit_image(image: Image.Image, image_shape: tuple[int, int, int]) -> torch.Tensor:
    """A PIL image as uint8 (C, H, W) of `image_shape`: decoded, then, if its size differs, scaled
    to cover H x W and centre-cropped (torchvision's Resize + CenterCrop)."""
    channels, height, width = image_shape
    image = decode(image, channels)
    if image.size != (width, height):
        image = ImageOps.fit(image, (width, height), Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.uint8).reshape(height, width, channels)
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy())


def to_uint8_batch(images, image_shape: tuple[int, int, int]) -> torch.Tensor:
    """A uint8 batch (N, C, H, W) from a uint8 tensor (N, C, H, W) or (C, H, W), a PIL image, or a
    list of them."""
    if isinstance(images, Image.Image):
        images = [images]
    if isinstance(images, (list, tuple)):
        images = torch.stack([fit_image(i, image_shape) if isinstance(i, Image.Image)
                              else torch.as_tensor(i) for i in images])
    if images.dtype != torch.uint8:
        raise TypeError(f"classify takes uint8 images (0..255) or PIL images, "
                        f"not {images.dtype} tensors")
    if images.dim() == 3:
        images = images.unsqueeze(0)
    if tuple(images.shape[1:]) != tuple(image_shape):
        raise ValueError(f"this model takes images of shape {tuple(image_shape)}, "
                         f"not {tuple(images.shape[1:])}; pass PIL images to have them resized")
    return images


def list_images(folders: list[Path]) -> tuple[list[list[Path]], list[Path]]:
    """The image files (by extension, `is_image`) under each of `folders`, sorted, each real file
    once, and the files that are not images; hidden files and folders are neither.

    What lies in a folder is its own; links are followed afterwards, to what was not read already: a
    link loop, or a link into another class or split, adds nothing (os.walk(followlinks=True) would
    read a loop until the paths got too long). The folders' parents (a split, the root) count as
    read.
    """
    seen = set()

    def first_visit(path: Path) -> bool:
        try:
            st = path.stat()
        except OSError:  # a dangling link: listed, so that reading it names it
            return True
        key = (st.st_dev, st.st_ino)
        return key not in seen and not seen.add(key)

    for folder in folders:
        first_visit(folder.parent)
        first_visit(folder.parent.parent)
    # what lies in the folders, without following links; then the links, all the way, to what is new
    listed = [_walk(folder, first_visit, follow=False) for folder in folders]
    found = [sorted(files + [f for link in links for f in _walk(link, first_visit, True)[0]])
             for files, links in listed]
    images = [[path for path in files if is_image(path.name)] for files in found]
    return images, sorted(path for files in found for path in files if not is_image(path.name))


def _walk(top: Path, first_visit, follow: bool) -> tuple[list[Path], list[Path]]:
    """The files under `top` (or `top`, a link to a file) that `first_visit` lets through, hidden
    ones aside, in folders it lets through; and, not following links, the links there."""
    if not top.is_dir():
        return list(filter(first_visit, [top])), []
    found, links = [], []
    for directory, subdirs, files in os.walk(top, followlinks=follow):
        if not first_visit(Path(directory)):
            subdirs.clear()
            continue
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        linked = [d for d in subdirs if not follow and Path(directory, d).is_symlink()]
        for path in [Path(directory, name) for name in sorted(files) + linked]:
            if path.name.startswith("."):
                continue
            if path.is_symlink() and not follow:
                links.append(path)
            elif first_visit(path):
                found.append(path)
    return found, links


class ImageFiles(Dataset):
    """Image files as `(uint8 image (C, H, W), error)`, for a DataLoader's worker processes to
    decode.

    A file that cannot be read gives a blank image and the reason, so that the caller decides: a
    training set refuses it, a prediction skips it. `size` (height, width): resize to it; None: keep
    each file's size (a batch then needs them all alike).
    """

    def __init__(self, paths: list[Path], channels: int, size: tuple[int, int] | None):
        self.paths, self.channels, self.size = list(paths), channels, size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        try:
            with Image.open(self.paths[i]) as image:
                image.load()  # reads the whole file: where a truncated one fails
                size = self.size or (image.height, image.width)
                return fit_image(image, (self.channels, *size)), ""
        except MemoryError:
            raise  # not a damaged file: the caller's to report
        except Exception as e:
            # PIL reports broken files as OSError, SyntaxError, ValueError, zlib errors...
            blank = torch.zeros(self.channels, *(self.size or (1, 1)), dtype=torch.uint8)
            return blank, f"{type(e).__name__}: {e}"

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, str]]):
        """A batch as (images, {index in the batch: error}) when the images have one size, else the
        list."""
        errors = {i: error for i, (_, error) in enumerate(items) if error}
        images = [image for image, _ in items]
        if all(image.shape == images[0].shape for image in images):
            return torch.stack(images), errors
        return images, errors

    def loader(self, batch_size: int = 256) -> DataLoader:
        """Batches of `collate`, decoded by worker processes on every usable core (none for a single
        batch: starting a worker costs more than decoding it)."""
        batches = -(-len(self) // batch_size)
        workers = min(usable_cpus(), batches) if batches > 1 else 0
        return DataLoader(self, batch_size=batch_size, collate_fn=self.collate, num_workers=workers)


def usable_cpus() -> int:
    """The cores this process may run on (its affinity, where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
