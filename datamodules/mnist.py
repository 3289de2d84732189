"""MNIST and Fashion-MNIST: 60,000 training and 10,000 test images, 28x28 grey, in IDX files
(downloaded by torchvision)."""

import contextlib
import gzip
import struct
from pathlib import Path

import torch
from torchvision.datasets import MNIST, FashionMNIST

from datamodules.base import ImageDataModule, reading
from datamodules.files import written_whole


def idx_array(data: bytes) -> torch.Tensor:
    """The uint8 array of an IDX file's bytes: 00 00 08 NDIM, NDIM big-endian sizes, the values.
    torchvision's reader (`read_sn3_pascalvincent_tensor`) opens a path itself: this one reads
    bytes in memory, such as those of a .gz in a folder that cannot be written."""
    if data[:3] != b"\0\0\x08":
        raise ValueError(f"not an IDX file of bytes: it begins '{data[:4].hex(' ')}'")
    shape = struct.unpack(f">{data[3]}I", data[4:4 + 4 * data[3]])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=4 + 4 * data[3]).view(shape)


class MNISTDataModule(ImageDataModule):
    """MNIST (`--data MNISTDataModule`), downloaded by torchvision into `data_dir/MNIST/raw/`.

    Its four IDX files may be there gzipped or not (Debian's Fashion-MNIST ships .gz files whose
    md5 sums are not torchvision's, which then refuses them): a .gz is unpacked beside itself on
    first use, or read in memory where its folder is read-only. No augmentation by default (a
    flipped digit is another digit). The arguments are ImageDataModule's.
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
        names = [name.removesuffix(".gz") for name, _ in self.dataset.resources]
        raw = self.raw_folder
        # a file there, damaged or not, is read: read() names what is wrong with it
        if not all((raw / name).exists() or (raw / f"{name}.gz").exists() for name in names):
            self.fetch(f"{self.dataset.__name__} is not in {raw}",
                       lambda: self.dataset(raw.parent.parent, download=True),
                       f"Put its four IDX files there, gzipped or not: {', '.join(names)}", raw)

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        prefix = {"train": "train", "test": "t10k"}[split]
        images = self.read_idx(f"{prefix}-images-idx3-ubyte", -1, *self.image_shape[1:])
        labels = self.read_idx(f"{prefix}-labels-idx1-ubyte", len(images))
        return images.unsqueeze(1).contiguous(), labels.long()

    def read_idx(self, name: str, *shape: int) -> torch.Tensor:
        """The IDX file `name` of raw_folder (or, where it is missing, its .gz), as an array of
        `shape`: one of other images, or with a label for fewer images, is named."""
        path, gz = self.raw_folder / name, self.raw_folder / f"{name}.gz"
        if gz.exists() and not path.exists():
            path = gz
        with reading(path, f"delete it and run again with --data.download true to download "
                           f"{self.dataset.__name__} again, or put a whole copy of {name} "
                           f"(gzipped or not) in {self.raw_folder}"):
            data = path.read_bytes()
            if path == gz:
                data = gzip.decompress(data)
            array = idx_array(data).view(shape)
        # A whole .gz unpacked beside itself, once, so that later runs skip the decompression;
        # where the folder cannot be written, it is read in memory each time.
        if path == gz:
            with contextlib.suppress(OSError), written_whole(self.raw_folder / name) as tmp:
                tmp.write_bytes(data)
        return array


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (`--data FashionMNISTDataModule`), downloaded by torchvision into
    `data_dir/FashionMNIST/raw/`.

    Same shape and split sizes as MNIST. The arguments are ImageDataModule's.
    """

    name = "fashion_mnist"
    dataset = FashionMNIST
    classes = list(FashionMNIST.classes)
