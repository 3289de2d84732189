"""Your own images: a folder with train/<class>/, test/<class>/ and optionally val/<class>/ image
files."""

import hashlib
import io
import math
import os
import warnings
from pathlib import Path
from typing import Iterator, Literal, Optional, Union

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from datamodules.base import DataError, DiskImages, ImageDataModule
from datamodules.files import written_whole
from datamodules.images import DECODER_VERSION, ImageFiles, list_images, some


def decode_files(paths: list[Path], channels: int,
                 size: Optional[tuple[int, int]]) -> Iterator[torch.Tensor]:
    """Image files as uint8 batches (n, C, H, W), in order, decoded by DataLoader worker processes
    on every core; a DataError naming the first file that cannot be read, or whose size differs."""
    shape = None
    for b, (images, errors) in enumerate(ImageFiles(paths, channels, size).loader(batch_size=256)):
        if errors:
            i, error = next(iter(errors.items()))
            raise DataError(f"cannot read the image {paths[b * 256 + i]} ({error}); replace "
                            f"or remove it")
        if isinstance(images, list) or images.shape[1:] != (shape or images.shape[1:]):
            raise DataError(f"the images in {paths[0].parent.parent} are not all of one size; pass "
                            f"--data.image_size N to resize every image to NxN")
        shape = images.shape[1:]
        yield images


class ImageFolderDataModule(ImageDataModule):
    """A folder of your own images (`--data ImageFolderDataModule --data.root DIR`), laid out as for
    torchvision's ImageFolder.

    DIR/train/<class>/*, DIR/test/<class>/* and optionally DIR/val/<class>/* (without it, `val_size`
    images split off train validate). The classes are the sorted folder names of DIR/train (hidden
    ones skipped); test and val must have the same. Subfolders of a class folder belong to it; links
    are followed, each real file read once. Files are decoded by `datamodules.images` (also used to
    predict files), once, by every core, into a uint8 cache in `data_dir/cache/` (a .npy file, not
    in DIR), rebuilt when a file is added, removed or changed.

    Args:
        root: the folder holding train/ and test/.
        image_size: resize every image to image_size x image_size (the shorter side, then a centre
            crop); needed when the images differ in size.
        channels: 1 (grey) or 3 (RGB); by default 1 if every training image is grey, else 3.
        in_memory: read a split's cache into memory (true), or each batch from it (false: data
            larger than memory, `base.DiskImages`); auto: in memory when it takes at most a quarter
            of the machine's memory.

    No augmentation by default (only you know whether a mirrored image is the same class). The other
    arguments are ImageDataModule's.
    """

    name = "image_folder"

    def __init__(self, root: str, image_size: Optional[int] = None,
                 channels: Optional[Literal[1, 3]] = None,
                 in_memory: Union[bool, Literal["auto"]] = "auto", **kwargs):
        super().__init__(**kwargs)
        self.root = Path(root).expanduser().resolve()
        self.image_size, self.channels, self.in_memory = image_size, channels, in_memory
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
            raise DataError(f"there is no folder {folder}: --data.root must hold train/<class>/ "
                            f"and test/<class>/ folders of images (and optionally val/<class>/)")
        classes = sorted(e.name for e in os.scandir(folder)
                         if e.is_dir() and not e.name.startswith("."))
        if len(classes) < 2:
            raise DataError(f"{folder} has {len(classes)} class folder(s): a classifier needs two "
                            f"or more, each class's images in a folder named after it")
        return classes

    def prepare_data(self) -> None:
        self.files("train")
        for split in self._files:
            # decoded and cached once per machine, before the processes of a DDP run read it
            self.read(split)

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in self._decoded:
            self._decoded[split] = self._read(split)
        return self._decoded[split]

    def files(self, split: str) -> tuple[list[Path], list[int]]:
        """The image files of a split in ImageFolder's order, and their labels (every split is
        listed at once: a link from one into another is then found)."""
        if not self._files:
            splits = ("train", "val", "test") if self.has_val_split else ("train", "test")
            for other in splits:
                if self._class_folders(other) != self.classes:
                    raise DataError(f"{self.root / other} must have the same class folders as "
                                    f"{self.root / 'train'}")
            found, skipped = list_images([self.root / other / name for other in splits
                                          for name in self.classes])
            if skipped:
                rank_zero_warn(f"skipped {len(skipped)} files in {self.root} that are not images "
                               f"Pillow reads (by their extension): {some(skipped, self.root)}")
            n = len(self.classes)
            self._files = {other: found[i * n:(i + 1) * n] for i, other in enumerate(splits)}
        for name, paths in zip(self.classes, self._files[split]):
            if not paths:
                raise DataError(f"the class folder {self.root / split / name} has no image files "
                                f"Pillow reads, or only links to images read already")
        return ([path for paths in self._files[split] for path in paths],
                [label for label, paths in enumerate(self._files[split]) for _ in paths])

    def _read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        files, labels = self.files(split)
        # what each file was: its size and time (a dangling link has none: decoding names it)
        stats = [(str(f), st.st_size, st.st_mtime_ns) for f in files if f.exists()
                 for st in [f.stat()]]
        key = _digest((DECODER_VERSION, split, self.image_size, self.channels, stats))
        settings = _digest((str(self.root), self.image_size, self.channels))[:10]
        cache = Path(self.data_dir).expanduser() / "cache"
        stem = f"image_folder-{self.root.name}-{settings}-{split}"
        # numpy's format, named after what it was decoded from
        path = cache / f"{stem}-{key[:16]}.npy"
        try:
            return self._images(path, len(files), split), torch.tensor(labels)
        except (OSError, ValueError, EOFError):  # none yet, or not whole: decode again
            pass
        try:
            with written_whole(path) as tmp, open(tmp, "w+b") as file:
                self._decode(split, files, file)
        except OSError as e:
            warnings.warn(f"could not write the image cache {path} ({e}); decoding again next run")
            self._decode(split, files, file := io.BytesIO())
            file.seek(0)
            return torch.from_numpy(np.load(file)), torch.tensor(labels)
        # of the files as they were, or an earlier .pt
        for old in set(cache.glob(f"{stem}*")) - {path}:
            old.unlink()
        return self._images(path, len(files), split), torch.tensor(labels)

    def _images(self, path: Path, count: int, split: str):
        """The cached images of a split, in memory or on disk (`in_memory`); a ValueError for a
        file that is not the `count` images (N, C, H, W) this data module decodes: damaged, or
        not ours (uint8 in C order, of the channels and size asked for, and of the training
        images' shape for the other splits)."""
        images = np.load(path, mmap_mode="r")  # its header: nothing read
        asked = (self.channels, self.image_size, self.image_size)  # None: any
        if split != "train":
            asked = self.image_shape
        laid_out = images.dtype == np.uint8 and images.ndim == 4 and images.flags.c_contiguous
        as_asked = all(a in (None, n) for a, n in zip(asked, images.shape[1:]))
        if not (laid_out and as_asked and len(images) == count and images.shape[1] in (1, 3)):
            raise ValueError(f"{path} is not a cache of {count} images")
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        fits_a_quarter = self.in_memory == "auto" and 4 * images.nbytes <= memory
        if self.in_memory is True or fits_a_quarter:
            return torch.from_numpy(np.load(path))
        return DiskImages(path, images.shape, images.offset)

    def _decode(self, split: str, files: list[Path], file) -> None:
        """Decode `files` into `file` as a .npy array (N, C, H, W), a batch at a time."""
        rank_zero_info(f"Decoding the {len(files):,} images in {self.root / split} "
                       f"(cached for later runs)")
        size = (self.image_size, self.image_size) if self.image_size else None
        grey = split == "train" and self.channels is None
        header = {"descr": "|u1", "fortran_order": False}
        channels, height, width = self.channels or 3, 0, 0
        if split != "train":  # the other splits follow the training images
            channels, height, width = self.image_shape
        for images in decode_files(files, channels, size):
            # A Trainer's stage only notes a SIGTERM, and stops after its next step: not an hour
            # of decoding later.
            if self.trainer is not None and self.trainer.received_sigterm:
                raise SIGTERMException
            # the first batch: decode_files checks that the others are of its size
            if not file.tell():
                shape = (len(files), *images.shape[1:])
                if height and shape[2:] != (height, width):
                    raise DataError(f"the images in {self.root / split} are {shape[3]}x{shape[2]}, "
                                    f"the training images {width}x{height}; pass "
                                    f"--data.image_size N to resize every image to NxN")
                np.lib.format.write_array_header_1_0(file, {**header, "shape": shape})
            grey = grey and bool((images[:, :1] == images).all())
            file.write(images.numpy().data)
        # One channel: each image's first plane moved down in place, over planes already moved or
        # read.
        if grey:
            file.seek(0)
            grey_shape = (len(files), 1, *shape[2:])
            # as long as the header it replaces
            np.lib.format.write_array_header_1_0(file, {**header, "shape": grey_shape})
            start, plane = file.tell(), math.prod(shape[2:])
            for i in range(len(files)):
                file.seek(start + 3 * i * plane)
                first = file.read(plane)
                file.seek(start + i * plane)
                file.write(first)
            file.truncate(start + len(files) * plane)


def _digest(value) -> str:
    return hashlib.sha1(repr(value).encode()).hexdigest()

