"""CIFAR-10: 50,000 training and 10,000 test images, 32x32 RGB, 10 classes, in torchvision's
python pickles."""

import pickle
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import download_and_extract_archive

from datamodules.base import ImageDataModule, reading


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10 (`--data CIFAR10DataModule`), downloaded from torchvision's source into
    `data_dir/cifar-10-batches-py/`.

    Its pickles are read as they are, not through torchvision's CIFAR10 class, which refuses a
    copy whose md5 sums are not the original's (one re-packed elsewhere may be whole all the
    same). Augmented by default as the fast recipe wants it: random 4-pixel crops and horizontal
    flips (`--data.crop_padding 0 --data.flip false` turns both off). The arguments are
    ImageDataModule's.
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

    def files(self, split: str) -> list[Path]:
        """The pickles of a split ("train" or "test"), as torchvision's CIFAR10 lists them."""
        folder = Path(self.data_dir).expanduser() / CIFAR10.base_folder
        return [folder / name for name, _ in {"train": CIFAR10.train_list,
                                              "test": CIFAR10.test_list}[split]]

    def prepare_data(self) -> None:
        # A folder or a damaged file in a batch's place is there: read() says what is wrong with it.
        missing = [p for p in self.files("train") + self.files("test") if not p.exists()]
        if missing:
            root = missing[0].parent.parent
            self.fetch(f"CIFAR-10 is not whole in {missing[0].parent} (no "
                       f"{', '.join(p.name for p in missing)})",
                       lambda: download_and_extract_archive(CIFAR10.url, str(root),
                                                            filename=CIFAR10.filename,
                                                            md5=CIFAR10.tgz_md5),
                       f"Put {CIFAR10.filename} (from {CIFAR10.url}), or its extracted "
                       f"{CIFAR10.base_folder}/, in {root}", root)

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = [], []
        fix = (f"delete it and run again with --data.download true to download CIFAR-10 again, or "
               f"put a whole {CIFAR10.base_folder}/ (in {CIFAR10.filename}, from {CIFAR10.url}) "
               f"in {Path(self.data_dir).expanduser()}")
        for path in self.files(split):
            with reading(path, fix):
                # rows of 3072 bytes: the R, G and B planes of a 32x32 image
                batch = pickle.loads(path.read_bytes(), encoding="latin1")
                images.append(torch.from_numpy(np.asarray(batch["data"]).reshape(-1, 3, 32, 32)))
                labels.append(torch.tensor(batch["labels"]).view(len(images[-1])))  # one each
        return torch.cat(images), torch.cat(labels)
