"""LightningDataModules: download, decode, cache, split, augment and batch image data sets."""

from datamodules.base import DataSetupError, ImageDataModule
from datamodules.checkpoint import CheckpointData
from datamodules.cifar10 import CIFAR10DataModule
from datamodules.image_folder import ImageFolderDataModule
from datamodules.mnist import FashionMNISTDataModule, MNISTDataModule

__all__ = ["CheckpointData", "CIFAR10DataModule", "DataSetupError", "FashionMNISTDataModule", "ImageDataModule",
           "ImageFolderDataModule", "MNISTDataModule"]
