"""CIFAR-10 through torchvision: 50,000 training and 10,000 test images, 32x32 RGB, 10 classes."""

from pathlib import Path
from urllib.error import URLError

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from torchvision.datasets import CIFAR10

from datamodules.base import DataSetupError, ImageDataModule, download_failure


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10 (`--data cifar10`), downloaded by torchvision into `data_dir`.

    Augmented by default as the fast recipe wants it: random 4-pixel crops and horizontal flips
    (`--data.crop_padding 0 --data.flip false` turns both off). The other arguments are
    ImageDataModule's.
    """

    name = "cifar10"
    # torchvision reads these from batches.meta; they are needed before the data is there.
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def __init__(self, data_dir: str = "./data", batch_size: PositiveInt = 128,
                 crop_padding: NonNegativeInt = 4, flip: bool = True, **kwargs):
        super().__init__(data_dir=data_dir, batch_size=batch_size, crop_padding=crop_padding, flip=flip,
                         **kwargs)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (3, 32, 32)

    def source_files(self, split: str) -> list[Path]:
        folder = self.data_dir / CIFAR10.base_folder
        names = CIFAR10.train_list if split == "train" else CIFAR10.test_list
        return [folder / name for name, _ in names] + [folder / CIFAR10.meta["filename"]]

    def fetch(self) -> None:
        root = self.writable_data_dir()
        try:
            CIFAR10(root, train=True, download=True)
        except (URLError, OSError, RuntimeError) as e:
            raise DataSetupError(
                f"CIFAR-10 is not in {self.data_dir} and could not be downloaded ({download_failure(e)}). "
                f"Put {CIFAR10.filename} (from {CIFAR10.url}) into {self.data_dir}/, or its extracted "
                f"{CIFAR10.base_folder}/ folder (data_batch_1..5, test_batch, batches.meta), "
                f"or pass --data.data_dir with the folder that holds them.") from None

    def decode(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            ds = CIFAR10(self.data_dir, train=split == "train", download=False)
        except RuntimeError as e:  # torchvision's md5 check failed
            raise DataSetupError(
                f"CIFAR-10 in {self.data_dir / CIFAR10.base_folder} is corrupted or incomplete ({e}). "
                f"Move that folder away and run again to download it afresh.") from None
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2)
        return images.contiguous(), torch.tensor(ds.targets)

