"""CIFAR-10 through torchvision: 50,000 training and 10,000 test images, 32x32 RGB, 10 classes."""

import pickle
import warnings
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import CIFAR10

from datamodules.base import DataError, ImageDataModule, download_error


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10 (`--data cifar10`), downloaded by torchvision into `data_dir`.

    Augmented by default as the fast recipe wants it: random 4-pixel crops and horizontal flips
    (`--data.crop_padding 0 --data.flip false` turns both off). The arguments are ImageDataModule's.
    """

    name = "cifar10"
    # torchvision reads these from batches.meta; they are needed before the data is there.
    classes = ["airplane", "automobile", "bird", "cat", "deer",
               "dog", "frog", "horse", "ship", "truck"]
    image_shape = (3, 32, 32)

    def __init__(self, data_dir: str = "./data", batch_size: int = 128, crop_padding: int = 4,
                 flip: bool = True, **kwargs):
        super().__init__(data_dir=data_dir, batch_size=batch_size, crop_padding=crop_padding,
                         flip=flip, **kwargs)

    def _files(self, split: str) -> list[Path]:
        folder = Path(self.data_dir).expanduser() / CIFAR10.base_folder
        listed = CIFAR10.test_list
        if split == "train":
            listed = CIFAR10.train_list
        return [folder / name for name, _ in listed]

    def prepare_data(self) -> None:
        if all(path.is_file() for path in self._files("train") + self._files("test")):
            return
        if not self.download:
            raise DataError(f"CIFAR-10 is not in {self.data_dir} (and --data.download is false)")
        try:
            CIFAR10(Path(self.data_dir).expanduser(), train=True, download=True)
        except (OSError, RuntimeError) as e:  # no network, a full disk, a refused md5
            raise DataError(f"CIFAR-10 is not in {self.data_dir} and could not be downloaded "
                            f"({download_error(e)}). Put {CIFAR10.filename} (from {CIFAR10.url}), "
                            f"or its extracted {CIFAR10.base_folder}/, there, or pass "
                            f"--data.data_dir with the folder that holds it") from None

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        # torchvision's class hashes every file as it is made: a check of ours before it hashed a
        # genuine copy twice.
        try:
            data = CIFAR10(Path(self.data_dir).expanduser(), train=split == "train")
            images, labels = data.data, data.targets
        except RuntimeError:  # "not found or corrupted": a copy re-packed elsewhere
            images, labels = self.read_as_it_is(split)
        images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
        return torch.from_numpy(images), torch.tensor(labels)

    def read_as_it_is(self, split: str) -> tuple[np.ndarray, list[int]]:
        """A split's images (NHWC) and labels from pickles whose checksums are not torchvision's:
        they may be whole all the same."""
        files = self._files(split)
        try:
            entries = [pickle.loads(path.read_bytes(), encoding="latin1") for path in files]
            images = np.concatenate([e["data"] for e in entries])
            images = images.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            labels = [label for e in entries for label in e["labels"]]
        except Exception as e:  # a truncated or foreign file: whatever pickle or numpy raise
            raise DataError(f"cannot read CIFAR-10's {split} files in {files[0].parent} "
                            f"({type(e).__name__}: {e}); replace them with a whole copy "
                            f"(from {CIFAR10.url})") from None
        warnings.warn(f"CIFAR-10's {split} files in {files[0].parent} differ from "
                      f"torchvision's checksums; read as they are ({len(labels)} images)")
        return images, labels
