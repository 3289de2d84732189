"""MNIST and Fashion-MNIST through torchvision: 60,000 training and 10,000 test images, 28x28
grey."""

import gzip
from pathlib import Path

import torch
from torchvision.datasets import MNIST, FashionMNIST

from datamodules.base import DataError, ImageDataModule, download_error


class MNISTDataModule(ImageDataModule):
    """MNIST (`--data mnist`), downloaded by torchvision into `data_dir/MNIST/raw/`.

    No augmentation by default (a flipped digit is another digit). The arguments are
    ImageDataModule's.
    """

    name = "mnist"
    dataset = MNIST
    classes = list(MNIST.classes)
    image_shape = (1, 28, 28)

    def __init__(self, data_dir: str = "./data", batch_size: int = 1536, **kwargs):
        super().__init__(data_dir=data_dir, batch_size=batch_size, **kwargs)

    @property
    def raw_folder(self) -> Path:
        return Path(self.data_dir).expanduser() / self.dataset.__name__ / "raw"

    def prepare_data(self) -> None:
        # torchvision takes a .gz put into raw/ only if its md5 is the original's; a re-packed copy
        # (Debian's dataset-fashion-mnist) holds the same IDX bytes in another gzip stream. The IDX
        # reader checks them.
        for name, _ in self.dataset.resources:
            archive = self.raw_folder / name
            target = self.raw_folder / name.removesuffix(".gz")
            if archive.is_file() and not target.is_file():
                try:
                    target.with_suffix(".part").write_bytes(gzip.decompress(archive.read_bytes()))
                except (OSError, EOFError) as e:
                    raise DataError(f"{archive} is not a readable gzip file ({e})") from None
                target.with_suffix(".part").replace(target)
        names = [name.removesuffix(".gz") for name, _ in self.dataset.resources]
        if all((self.raw_folder / name).is_file() for name in names):
            return
        if not self.download:
            raise DataError(f"{self.dataset.__name__} is not in {self.raw_folder} "
                            f"(and --data.download is false)")
        try:
            self.dataset(Path(self.data_dir).expanduser(), download=True)
        except (OSError, RuntimeError) as e:
            raise DataError(f"{self.dataset.__name__} is not in {self.raw_folder} and could not be "
                            f"downloaded ({download_error(e)}). Put its four IDX files there, "
                            f"gzipped or not: {', '.join(names)}, or pass --data.data_dir with the "
                            f"folder that holds {self.dataset.__name__}/raw/") from None

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            data = self.dataset(Path(self.data_dir).expanduser(), train=split == "train")
        except (OSError, RuntimeError, ValueError, AssertionError) as e:
            # missing, truncated or foreign IDX files
            raise DataError(f"cannot read {self.dataset.__name__}'s {split} files in "
                            f"{self.raw_folder} ({type(e).__name__}: {e}); "
                            f"replace them with whole copies") from None
        return data.data.unsqueeze(1).contiguous(), data.targets


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (`--data fashion_mnist`), downloaded by torchvision into
    `data_dir/FashionMNIST/raw/`.

    Same shape and split sizes as MNIST. The arguments are ImageDataModule's.
    """

    name = "fashion_mnist"
    dataset = FashionMNIST
    classes = list(FashionMNIST.classes)
