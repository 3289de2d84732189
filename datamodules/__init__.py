"""LightningDataModules: download, read, split, augment and batch image data sets (one file per data
source)."""

from datamodules.base import DataError, DeviceBatches, ImageDataModule
from datamodules.cifar10 import CIFAR10DataModule
from datamodules.image_folder import ImageFolderDataModule
from datamodules.mnist import FashionMNISTDataModule, MNISTDataModule

__all__ = ["CIFAR10DataModule", "DataError", "DeviceBatches", "FashionMNISTDataModule",
           "ImageDataModule", "ImageFolderDataModule", "MNISTDataModule"]
