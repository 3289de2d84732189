"""MNIST and Fashion-MNIST: 60,000 training and 10,000 test images, 28x28 grey, in IDX files
(downloaded by torchvision)."""

import gzip
import math
import re
import struct
import zlib
from pathlib import Path

import torch
from torchvision.datasets import MNIST, FashionMNIST

from datamodules.base import DataError, ImageDataModule, download_error, unwritable
from datamodules.files import written_whole

IDX_BYTES = 0x08  # an IDX file's type code for unsigned bytes, MNIST's


def parse_idx(data: bytes, path: Path, ndim: int) -> torch.Tensor:
    """The uint8 array of an IDX file's bytes (header 00 00 08 NDIM, NDIM big-endian sizes, the
    values), or a DataError naming `path` and what is wrong with it. torchvision's reader says
    nothing of a damaged header (a bare assertion, a KeyError) and reads no gzip."""
    start = 4 + 4 * ndim
    if len(data) < start:
        size = f"{len(data)} bytes, shorter than an IDX header"
        if not data:
            size = "empty"
        raise DataError(f"{path} is {size}; replace it with a whole copy")
    magic = bytes([0, 0, IDX_BYTES, ndim])
    if data[:4] != magic:
        raise DataError(f"{path} is not an IDX file of {ndim}-dimensional bytes: it begins "
                        f"{data[:4].hex(' ')}, not {magic.hex(' ')}; replace it with a whole copy")
    shape = struct.unpack(f">{ndim}I", data[4:start])
    if len(data) - start != math.prod(shape):
        raise DataError(f"{path} holds {len(data) - start:,} bytes of values where its header "
                        f"says {' x '.join(map(str, shape))} ({math.prod(shape):,}): truncated or "
                        f"damaged; replace it with a whole copy")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=start).view(*shape)


def idx_ndim(path: Path) -> int:
    """How many dimensions an IDX file has, as MNIST's file names say (train-images-idx3-ubyte:
    3)."""
    return int(re.search(r"idx(\d)", path.name)[1])


def read_idx(path: Path) -> torch.Tensor:
    """The IDX file `path`, or, where it is missing, `path`.gz, read in memory (its folder may be
    read-only)."""
    gz = path.with_name(path.name + ".gz")
    source = path
    if not path.exists() and gz.exists():
        source = gz
    try:
        data = source.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {source} ({e.strerror})") from None
    if source == gz:
        data = gunzip(data, gz)
    return parse_idx(data, source, idx_ndim(path))


def gunzip(data: bytes, path: Path) -> bytes:
    """The bytes of a gzip file, or a DataError naming it."""
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path} is not a whole gzip file ({e}); replace it with a whole "
                        f"copy") from None


class MNISTDataModule(ImageDataModule):
    """MNIST (`--data mnist`), downloaded by torchvision into `data_dir/MNIST/raw/`.

    Its four IDX files may be there gzipped or not; a .gz is unpacked beside itself once where
    the folder can be written, and read in memory where it cannot. No augmentation by default (a
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

    @property
    def names(self) -> list[str]:
        """The IDX files' names, as torchvision unpacks them."""
        return [name.removesuffix(".gz") for name, _ in self.dataset.resources]

    def prepare_data(self) -> None:
        # torchvision takes a .gz put into raw/ only if its md5 is the original's; a re-packed copy
        # (Debian's dataset-fashion-mnist) holds the same IDX bytes in another gzip stream.
        for name in self.names:
            self.unpack(name)
        if all(self.present(name) for name in self.names):
            return  # damaged or not: read() names what is wrong
        if not self.download:
            raise DataError(f"{self.dataset.__name__} is not in {self.raw_folder} "
                            f"(and --data.download is false)")
        try:
            self.dataset(Path(self.data_dir).expanduser(), download=True)
        except (OSError, RuntimeError) as e:
            where = unwritable(e, f"{self.dataset.__name__} is downloaded into {self.raw_folder}")
            raise DataError(where or (
                f"{self.dataset.__name__} is not in {self.raw_folder} and could not be "
                f"downloaded ({download_error(e)}). Put its four IDX files there, gzipped or "
                f"not: {', '.join(self.names)}, or pass --data.data_dir with the folder that "
                f"holds {self.dataset.__name__}/raw/")) from None

    def present(self, name: str) -> bool:
        """Whether the IDX file, or its .gz, is there (a folder in its place too: read() says
        so)."""
        path = self.raw_folder / name
        return path.exists() or path.with_name(name + ".gz").exists()

    def unpack(self, name: str) -> None:
        """Unpack NAME.gz beside itself, once, so that later runs read it without the
        decompression. A damaged one, or a folder that cannot be written, is left as it is:
        read() names the first, and reads the .gz in memory in the second."""
        path = self.raw_folder / name
        gz = path.with_name(name + ".gz")
        if path.exists() or not gz.is_file():
            return
        try:
            data = gunzip(gz.read_bytes(), gz)
            parse_idx(data, gz, idx_ndim(path))
            with written_whole(path) as tmp:
                tmp.write_bytes(data)
        except (DataError, OSError):
            pass

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        prefix = "train" if split == "train" else "t10k"
        images_file = self.raw_folder / f"{prefix}-images-idx3-ubyte"
        labels_file = self.raw_folder / f"{prefix}-labels-idx1-ubyte"
        images, labels = read_idx(images_file), read_idx(labels_file)
        if tuple(images.shape[1:]) != self.image_shape[1:]:
            raise DataError(f"{images_file} holds images of {images.shape[2]}x{images.shape[1]}, "
                            f"not {self.dataset.__name__}'s 28x28; replace it with a whole copy")
        if len(labels) != len(images):
            raise DataError(f"{labels_file} holds {len(labels):,} labels for the "
                            f"{len(images):,} images of {images_file.name}; replace the one "
                            f"that is not whole")
        if len(labels) and int(labels.max()) >= len(self.classes):
            raise DataError(f"{labels_file} holds the label {int(labels.max())}; "
                            f"{self.dataset.__name__}'s are 0 to {len(self.classes) - 1}: "
                            f"replace it with a whole copy")
        return images.unsqueeze(1).contiguous(), labels.long()


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (`--data fashion_mnist`), downloaded by torchvision into
    `data_dir/FashionMNIST/raw/`.

    Same shape and split sizes as MNIST. The arguments are ImageDataModule's.
    """

    name = "fashion_mnist"
    dataset = FashionMNIST
    classes = list(FashionMNIST.classes)
