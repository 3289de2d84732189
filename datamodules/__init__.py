"""LightningDataModules: download, read, split, augment and batch image data sets (one file per data
source). DATA maps each data set's short name (its record's "data") to its class."""

from datamodules.base import DataError, DeviceBatches, ImageDataModule
from datamodules.cifar10 import CIFAR10DataModule
from datamodules.image_folder import ImageFolderDataModule
from datamodules.mnist import FashionMNISTDataModule, MNISTDataModule

DATA: dict[str, type[ImageDataModule]] = {cls.name: cls for cls in (
    CIFAR10DataModule, MNISTDataModule, FashionMNISTDataModule, ImageFolderDataModule)}

__all__ = ["CIFAR10DataModule", "DATA", "DataError", "DeviceBatches", "FashionMNISTDataModule",
           "ImageDataModule", "ImageFolderDataModule", "MNISTDataModule"]
