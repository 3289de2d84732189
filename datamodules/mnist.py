"""MNIST and Fashion-MNIST through torchvision: 60,000 training and 10,000 test images, 28x28 grey."""

import gzip
from pathlib import Path
from urllib.error import URLError

import torch
from jsonargparse.typing import PositiveInt
from torchvision.datasets import MNIST, FashionMNIST

from datamodules.base import DataSetupError, ImageDataModule, download_failure


class MNISTDataModule(ImageDataModule):
    """MNIST (`--data mnist`), downloaded by torchvision into `data_dir/MNIST/raw/`.

    No augmentation by default (a flipped digit is another digit). The other arguments are
    ImageDataModule's.
    """

    name = "mnist"
    dataset_class = MNIST
    classes = list(MNIST.classes)

    def __init__(self, data_dir: str = "./data", batch_size: PositiveInt = 1536, **kwargs):
        super().__init__(data_dir=data_dir, batch_size=batch_size, **kwargs)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (1, 28, 28)

    @property
    def raw_folder(self) -> Path:
        return self.data_dir / self.dataset_class.__name__ / "raw"

    def source_files(self, split: str) -> list[Path]:
        prefix = "train" if split == "train" else "t10k"
        return [self.raw_folder / f"{prefix}-images-idx3-ubyte", self.raw_folder / f"{prefix}-labels-idx1-ubyte"]

    def fetch(self) -> None:
        self._extract_local_archives()
        if all(f.is_file() for f in self.source_files("train") + self.source_files("test")):
            return
        root = self.writable_data_dir()
        try:
            self.dataset_class(root, train=True, download=True)
        except (URLError, OSError, RuntimeError) as e:
            files = ", ".join(name for name, _ in self.dataset_class.resources)
            raise DataSetupError(
                f"{self.dataset_class.__name__} is not in {self.raw_folder} and could not be downloaded "
                f"({download_failure(e)}). Put its four IDX files there, gzipped or not: {files} "
                f"(from {self.dataset_class.mirrors[0]}), or pass --data.data_dir with the folder "
                f"that holds {self.dataset_class.__name__}/raw/.") from None

    def _extract_local_archives(self) -> None:
        """Decompress .gz files a user put into raw/ by hand.

        torchvision only uses a .gz it finds there if its md5 is the original's; re-packaged copies
        (Debian's dataset-fashion-mnist, say) hold the same IDX bytes in a different gzip stream. The
        IDX reader still checks what is inside.
        """
        for name, _ in self.dataset_class.resources:
            archive, target = self.raw_folder / name, self.raw_folder / name.removesuffix(".gz")
            if archive.is_file() and not target.is_file():
                tmp = target.with_name(target.name + ".part")
                try:
                    tmp.write_bytes(gzip.decompress(archive.read_bytes()))
                except (OSError, EOFError, gzip.BadGzipFile) as e:
                    tmp.unlink(missing_ok=True)
                    raise DataSetupError(f"{archive} is not a readable gzip file ({e})") from None
                tmp.replace(target)

    def decode(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        ds = self.dataset_class(self.data_dir, train=split == "train", download=False)
        return ds.data.unsqueeze(1).contiguous(), ds.targets


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (`--data fashion_mnist`), downloaded by torchvision into `data_dir/FashionMNIST/raw/`.

    Same shape and split sizes as MNIST. The arguments are ImageDataModule's.
    """

    name = "fashion_mnist"
    dataset_class = FashionMNIST
    classes = list(FashionMNIST.classes)
