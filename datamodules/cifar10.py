"""CIFAR-10 through torchvision: 50,000 training and 10,000 test images, 32x32 RGB, 10 classes."""

import pickle
import warnings
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import CIFAR10

from datamodules.base import DataError, ImageDataModule, download_error, unwritable


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
        # A folder or a damaged file in a batch's place is there: read() says what is wrong with it.
        missing = [p for p in self._files("train") + self._files("test") if not p.exists()]
        if not missing:
            return
        folder = missing[0].parent
        absent = f"CIFAR-10 is not in {self.data_dir}"
        if len(missing) < len(CIFAR10.train_list + CIFAR10.test_list):
            absent = f"CIFAR-10 is not whole in {folder} (no {', '.join(p.name for p in missing)})"
        if not self.download:
            raise DataError(f"{absent} (and --data.download is false)")
        try:
            CIFAR10(Path(self.data_dir).expanduser(), train=True, download=True)
        except (OSError, RuntimeError) as e:  # no network, a full disk, a refused md5
            where = unwritable(e, f"CIFAR-10 is downloaded and unpacked into {folder}")
            raise DataError(where or (
                f"{absent} and could not be downloaded ({download_error(e)}). Put "
                f"{CIFAR10.filename} (from {CIFAR10.url}), or its extracted "
                f"{CIFAR10.base_folder}/, there, or pass --data.data_dir with the folder that "
                f"holds it")) from None

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
        they may be whole all the same. A file that is not is named, with what is wrong."""
        files = self._files(split)
        entries = [read_batch(path, len(self.classes)) for path in files]
        images = np.concatenate([data for data, _ in entries])
        images = images.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        labels = [label for _, batch in entries for label in batch]
        warnings.warn(f"CIFAR-10's {split} files in {files[0].parent} differ from "
                      f"torchvision's checksums; read as they are ({len(labels)} images)")
        return images, labels


def read_batch(path: Path, num_classes: int) -> tuple[np.ndarray, list[int]]:
    """One CIFAR-10 batch file: its images as rows of 3072 bytes (R, G, B planes of 32x32) and its
    labels, or a DataError naming the file and what is wrong with it."""
    whole = f"replace it with a whole copy (from {CIFAR10.url})"
    try:
        entry = pickle.loads(path.read_bytes(), encoding="latin1")
    except OSError as e:
        raise DataError(f"cannot read {path} ({e.strerror})") from None
    except Exception as e:  # a truncated or foreign file: whatever pickle raises
        raise DataError(f"{path} is not a whole pickle ({type(e).__name__}: {e}); "
                        f"{whole}") from None
    if not isinstance(entry, dict) or not {"data", "labels"} <= entry.keys():
        raise DataError(f"{path} is not a CIFAR-10 batch (a dict with 'data' and 'labels'); "
                        f"{whole}")
    data, labels = entry["data"], list(entry["labels"])
    if not is_batch_of_images(data):
        described = f"a {type(data).__name__}"
        if isinstance(data, np.ndarray):
            described = f"{data.dtype} values of shape {data.shape}"
        raise DataError(f"{path} holds {described} as its 'data', not uint8 rows of 3072 "
                        f"(32x32 RGB images); {whole}")
    if len(labels) != len(data):
        raise DataError(f"{path} holds {len(labels)} labels for its {len(data)} images; {whole}")
    outside = [label for label in labels if label not in range(num_classes)]
    if outside:
        raise DataError(f"{path} holds the label {outside[0]!r}; CIFAR-10's are 0 to "
                        f"{num_classes - 1}: {whole}")
    return data, labels


def is_batch_of_images(data) -> bool:
    """Whether a batch's 'data' is CIFAR-10's: uint8, a row of 3 x 32 x 32 values per image."""
    is_array = isinstance(data, np.ndarray)
    return is_array and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072
