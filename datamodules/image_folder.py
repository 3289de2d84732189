"""Your own images: a folder with train/<class>/, test/<class>/ and optionally val/<class>/ image files."""

import hashlib
import os
import tempfile
import warnings
from pathlib import Path
from typing import Literal, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info

from datamodules.base import DataError, ImageDataModule
from datamodules.images import IMG_EXTENSIONS, ImageFiles, list_images


def decode_files(paths: list[Path], channels: int, size: Optional[tuple[int, int]]) -> torch.Tensor:
    """Image files as one uint8 tensor (N, C, H, W), decoded by DataLoader worker processes on every core;
    a DataError naming the first file that cannot be read, or whose size differs."""
    parts = []
    for b, (images, errors) in enumerate(ImageFiles(paths, channels, size).loader(batch_size=256)):
        if errors:
            i, error = next(iter(errors.items()))
            raise DataError(f"cannot read the image {paths[b * 256 + i]} ({error}); replace or remove it")
        if isinstance(images, list) or (parts and images.shape[1:] != parts[0].shape[1:]):
            raise DataError(f"the images in {paths[0].parent.parent} are not all of one size; pass "
                            f"--data.image_size N to resize every image to NxN")
        parts.append(images)
    return torch.cat(parts)


class ImageFolderDataModule(ImageDataModule):
    """A folder of your own images (`--data image_folder --data.root DIR`), laid out as for torchvision's ImageFolder.

    DIR/train/<class>/*, DIR/test/<class>/* and optionally DIR/val/<class>/* (without it, `val_size` images split
    off train validate). The classes are the sorted folder names of DIR/train (hidden ones skipped); test and val
    must have the same. Subfolders of a class folder belong to it; links are followed, each real file read once.
    Files are decoded by `datamodules.images` (also used to predict files), once, by every core, into a uint8
    cache in `data_dir/cache/` (not in DIR), rebuilt when a file is added, removed or changed.

    Args:
        root: the folder holding train/ and test/.
        image_size: resize every image to image_size x image_size (the shorter side, then a centre crop); needed
            when the images differ in size.
        channels: 1 (grey) or 3 (RGB); by default 1 if every training image is grey, else 3.

    No augmentation by default (only you know whether a mirrored image is the same class). The other arguments
    are ImageDataModule's.
    """

    name = "image_folder"

    def __init__(self, root: str, image_size: Optional[int] = None, channels: Optional[Literal[1, 3]] = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.root = Path(root).expanduser().resolve()
        self.image_size, self.channels = image_size, channels
        self._decoded: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._files: dict[str, list[list[Path]]] = {}

    @property
    def classes(self) -> list[str]:
        return self._class_folders("train")

    @property
    def has_val_split(self) -> bool:
        return (self.root / "val").is_dir()

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.read("train")[0].shape[1:])  # only the images say their size and channels

    def _class_folders(self, split: str) -> list[str]:
        folder = self.root / split
        if not folder.is_dir():
            raise DataError(f"there is no folder {folder}: --data.root must hold train/<class>/ and test/<class>/ "
                            f"folders of images (and optionally val/<class>/)")
        classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
        if len(classes) < 2:
            raise DataError(f"{folder} has {len(classes)} class folder(s): a classifier needs two or more, each "
                            f"class's images in a folder named after it")
        return classes

    @property
    def splits_on_disk(self) -> tuple[str, ...]:
        return ("train", "val", "test") if self.has_val_split else ("train", "test")

    def prepare_data(self) -> None:
        for split in self.splits_on_disk:
            self.read(split)  # decoded and cached once per machine, before the processes of a DDP run read it

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in self._decoded:
            self._decoded[split] = self._read(split)
        return self._decoded[split]

    def files(self, split: str) -> tuple[list[Path], list[int]]:
        """The image files of a split in ImageFolder's order, and their labels (every split is listed at once: a
        link from one into another is then found)."""
        if not self._files:
            splits = self.splits_on_disk
            for other in splits:
                if self._class_folders(other) != self.classes:
                    raise DataError(f"{self.root / other} must have the same class folders as {self.root / 'train'}")
            found = list_images([self.root / other / name for other in splits for name in self.classes])
            self._files = {other: found[i * len(self.classes):(i + 1) * len(self.classes)] for i, other in
                           enumerate(splits)}
        for name, paths in zip(self.classes, self._files[split]):
            if not paths:
                raise DataError(f"the class folder {self.root / split / name} has no images "
                                f"({' '.join(IMG_EXTENSIONS)}), or only links to images read already")
        return ([path for paths in self._files[split] for path in paths],
                [label for label, paths in enumerate(self._files[split]) for _ in paths])

    def _read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        files, labels = self.files(split)
        stats = [(str(f), *((st.st_size, st.st_mtime_ns) if (st := _stat(f)) else ())) for f in files]
        key = hashlib.sha1(repr((1, split, self.image_size, self.channels, stats)).encode()).hexdigest()
        settings = hashlib.sha1(repr((str(self.root), self.image_size, self.channels)).encode()).hexdigest()[:10]
        path = Path(self.data_dir).expanduser() / "cache" / f"image_folder-{self.root.name}-{settings}-{split}.pt"
        try:
            cached = torch.load(path, weights_only=True, mmap=True)
            if cached["key"] == key:
                return cached["images"], cached["labels"]
        except Exception:  # none yet, or stale, truncated or foreign: decode again
            pass
        images = self._decode(split, files)
        labels = torch.tensor(labels)
        _save({"key": key, "images": images, "labels": labels}, path)
        return images, labels

    def _decode(self, split: str, files: list[Path]) -> torch.Tensor:
        rank_zero_info(f"Decoding the {len(files):,} images in {self.root / split} (cached for later runs)")
        size = (self.image_size, self.image_size) if self.image_size else None
        if split == "train":
            images = decode_files(files, self.channels or 3, size)
            grey = self.channels is None and all((part[:, :1] == part).all() for part in images.split(4096))
            return images[:, :1].contiguous() if grey else images
        channels, height, width = self.image_shape  # the other splits follow the training images
        images = decode_files(files, channels, size)
        if images.shape[2:] != (height, width):
            raise DataError(f"the images in {self.root / split} are {images.shape[3]}x{images.shape[2]}, the training "
                            f"images {width}x{height}; pass --data.image_size N to resize every image to NxN")
        return images


def _stat(path: Path):
    try:
        return path.stat()
    except OSError:  # a dangling link: decoding names it
        return None


def _save(cached: dict, path: Path) -> None:
    """Write the cache through a temporary file renamed into place: a reader never sees half of one. A cache
    that cannot be written is a warning, and no temporary file is left behind."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as file:
            tmp = Path(file.name)
            torch.save(cached, file)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        warnings.warn(f"could not write the image cache {path} ({e}); decoding again next run")
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
