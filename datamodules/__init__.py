"""LightningDataModules: download, read, split, augment and batch image data sets (one file per data
source).

DATA maps the short names `--data NAME` takes to the classes: every ImageDataModule subclass
imported here, by its `name`. A data set added as a module of this package (a subclass with a
`name`) is found without more.
"""

import importlib
import pkgutil

from datamodules.base import DataError, DeviceBatches, ImageDataModule

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


DATA: dict[str, type[ImageDataModule]] = {c.name: c for c in _subclasses(ImageDataModule) if c.name}

from datamodules.cifar10 import CIFAR10DataModule  # noqa: E402
from datamodules.image_folder import ImageFolderDataModule  # noqa: E402
from datamodules.mnist import FashionMNISTDataModule, MNISTDataModule  # noqa: E402

__all__ = [
    "CIFAR10DataModule",
    "DATA",
    "DataError",
    "DeviceBatches",
    "FashionMNISTDataModule",
    "ImageDataModule",
    "ImageFolderDataModule",
    "MNISTDataModule",
]
