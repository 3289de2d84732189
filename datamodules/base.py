"""What every data module shares: a seeded validation split, the training images' statistics, and
batches cut from uint8 tensors that live on the training device, augmented there."""

import errno
import functools
import math
import sys
from typing import Literal, Optional, Union

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from datamodules.augment import mix_seed, random_crop, random_flip


class DataError(RuntimeError):
    """The data cannot be found, fetched or read; the message says what to do about it."""


def download_error(error: Exception) -> str:
    """The last line of a download error (torchvision's list one line per mirror tried)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def unwritable(error: Exception, what: str) -> str | None:
    """The line for a data folder that cannot be written (`what` says what is written there),
    where a download or unpacking failed so; None for any other failure (the network's)."""
    refused = (errno.EACCES, errno.EPERM, errno.EROFS)
    if not isinstance(error, OSError) or error.errno not in refused:
        return None
    return (f"{error.filename} cannot be written ({error.strerror}): {what}; pass a "
            f"--data.data_dir that can be written, or put the files there yourself")


def channel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of uint8 images (N, C, H, W), on the 0..1 scale,
    exactly (from a 256-bin histogram per channel, in float64)."""
    channels = images.shape[1]
    step = max(1, (1 << 24) // math.prod(images.shape[1:]))  # parts of 16 MB
    # On the host, whatever the default device: Lightning calls configure_model, which asks for
    # these, with the training device as the default.
    counts = torch.zeros(channels, 256, dtype=torch.float64, device="cpu")
    for rows in torch.arange(len(images), device=images.device).split(step):
        # `images`: a tensor or DiskImages
        values = images.index_select(0, rows).transpose(0, 1).reshape(channels, -1).cpu()
        # counted as uint8: no wider copy
        counts += torch.stack([torch.bincount(v, minlength=256) for v in values])
    levels = torch.arange(256, dtype=torch.float64, device="cpu") / 255
    mean = (counts * levels).sum(1) / counts.sum(1)
    var = (counts * levels.square()).sum(1) / counts.sum(1) - mean.square()
    return mean.tolist(), var.clamp(min=0).sqrt().tolist()


class DeviceBatches:
    """An iterable of `(uint8 images, labels)` batches cut from tensors on one device: a batch is
    one `index_select`, and its crops and flips a few batched tensor ops where the images are.

    For training (`train`): only full batches, in an order that is a function of `(seed, e)` in
    epoch e (the same order every epoch without `shuffle`), the augmentation of batch i a function
    of `(seed, e, i, rank)`. Lightning announces each epoch through `loader.sampler.set_epoch(e)`,
    as it does for a DistributedSampler. Under DDP, rank r of w takes every w-th image of that
    order, cut to the same number of batches on every rank. For evaluation, the ranks take disjoint
    contiguous parts, and every image is seen exactly once.

    It is resumable as Lightning asks (`state_dict`/`load_state_dict`): the epoch and the batches it
    yielded, so a run resumed mid-epoch trains exactly the batches it would have. `images` may be
    DiskImages: the same batches, each read from disk onto its device.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                 train: bool = False, shuffle: bool = True, crop_padding: int = 0,
                 reflect: bool = False, flip: bool = False, seed: int = 0, rank: int = 0,
                 world_size: int = 1, to_float: bool = False):
        self.images, self.labels, self.batch_size, self.train = images, labels, batch_size, train
        self.shuffle, self.crop_padding, self.flip = shuffle and train, crop_padding, flip
        self.reflect = reflect
        self.seed, self.rank, self.world_size, self.to_float = seed, rank, world_size, to_float
        self.epoch, self.yielded, self._resume = 0, 0, None
        if train:
            self.num_samples = len(images) // world_size
            self.num_batches = self.num_samples // batch_size
        else:
            all_rows = torch.arange(len(images), device=images.device)
            self.indices = all_rows.tensor_split(world_size)[rank]
            self.num_batches = math.ceil(len(self.indices) / batch_size)

    # Lightning calls `loader.sampler.set_epoch(e)` on any loader, and reads `batch_sampler` where
    # it finds a sampler.
    batch_sampler = None

    @property
    def sampler(self) -> "DeviceBatches":
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self._resume = state

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        device = self.images.device
        generator = torch.Generator(device=device)
        resume, self._resume = self._resume or {}, None
        start = 0
        if resume.get("epoch") == self.epoch:
            start = resume.get("batches", 0)
        if self.shuffle:
            epoch_seed = mix_seed(self.seed, self.epoch)
            order = torch.randperm(len(self.images), device=device,
                                   generator=generator.manual_seed(epoch_seed))
        elif self.train:
            order = torch.arange(len(self.images), device=device)
        else:
            order = self.indices
        if self.train:
            order = order[self.rank::self.world_size][:self.num_samples]
        for i in range(start, self.num_batches):
            index = order[i * self.batch_size:(i + 1) * self.batch_size]
            # index_select, not images[index]: on a CPU advanced indexing of uint8 images is many
            # times slower.
            images = self.images.index_select(0, index)
            if self.crop_padding or self.flip:
                # any batch, in any order
                generator.manual_seed(mix_seed(self.seed, self.epoch, i, self.rank))
            if self.crop_padding:
                images = random_crop(images, self.crop_padding, generator, self.reflect)
            if self.flip:
                images = random_flip(images, generator)
            if self.to_float:
                images = images.float().div_(255)
            self.yielded = i + 1
            yield images, self.labels.index_select(0, index)


class DiskImages:
    """uint8 images (N, C, H, W) in a file from byte `offset` on (`--data.in_memory false`): what
    DeviceBatches needs of a tensor. `images[rows]` and `to(device)` are views (nothing is read);
    `index_select(0, index)` reads those images onto the view's device, one read each. Reads, not a
    memory map: a map's pages count as the process's memory until the kernel takes them back."""

    def __init__(self, path, shape: tuple[int, ...], offset: int = 0,
                 rows: Optional[torch.Tensor] = None, device="cpu"):
        self.path, self.offset, self.device = str(path), offset, torch.device(device)
        self.rows = torch.arange(shape[0], device="cpu") if rows is None else rows
        self.shape = (len(self.rows), *shape[1:])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, rows) -> "DiskImages":
        return DiskImages(self.path, self.shape, self.offset, self.rows[rows], self.device)

    def to(self, device) -> "DiskImages":
        return DiskImages(self.path, self.shape, self.offset, self.rows, device)

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        images = torch.empty(len(index), *self.shape[1:], dtype=torch.uint8, device="cpu")
        with open(self.path, "rb", buffering=0) as file:
            for image, row in zip(images.numpy(), self.rows[index.cpu()].tolist()):
                file.seek(self.offset + row * image.nbytes)
                file.readinto(image)
        return images.to(self.device)


class ImageDataModule(L.LightningDataModule):
    """Base of the image data modules: a subclass says how to fetch and read its data set
    (`read(split)`).

    Each split is read once into uint8 tensors (N, C, H, W), moved to the training device
    (`on_device`), and batched there by DeviceBatches. A seeded split of the training images
    validates; the test set is only ever tested on. `mean` and `std` are the training images'
    statistics, the model's default normalisation.

    Args:
        data_dir: where the data set is, or is downloaded to.
        batch_size: training batch size, per process.
        eval_batch_size: validation, test and predict batch size, per process.
        val_size: training images held out for validation: a count, or a fraction (0 < f < 1); 0:
            none (every training image trains); default: a tenth, at most 5000.
        split_seed: seed of that split (fixed, so that runs with other seeds validate on the same
            images).
        crop_padding: random-crop augmentation: pad by this many pixels, crop back at a random
            offset (0: off).
        padding_mode: what the crops' padding holds: "constant" (zeros, torchvision's default)
            or "reflect" (the image mirrored at its borders: a shift with no black edge).
        flip: random horizontal flips.
        on_device: keep the data set on the training device (fast); false keeps it in host memory
            and moves each batch, for data that does not fit on the device.
        download: download the data set if it is missing.
        float_images: true: batches of float32 images on the 0..1 scale, as torchvision's
            ToTensor() gives them (a LightningModule as Lightning's docs write one); false: the
            uint8 images. None: what the model says (its `takes_uint8_images`: True for
            ImageClassifier), uint8 with no Trainer; floats for a model that says nothing, said
            in one line that names this option.
    """

    name: str = ""  # the short name `--data NAME` takes
    classes: list[str] = []
    image_shape: tuple[int, int, int] = (0, 0, 0)
    has_val_split = False  # whether read("val") gives a validation set of the data set's own

    def __init__(self, data_dir: str = "./data", batch_size: int = 128,
                 eval_batch_size: int = 1000, val_size: Optional[Union[int, float]] = None,
                 split_seed: int = 0, crop_padding: int = 0,
                 padding_mode: Literal["constant", "reflect"] = "constant", flip: bool = False,
                 on_device: bool = True, download: bool = True,
                 float_images: Optional[bool] = None):
        super().__init__()
        self.save_hyperparameters()
        batches_empty = batch_size < 1 or eval_batch_size < 1
        val_size_negative = val_size is not None and val_size < 0
        negative = crop_padding < 0 or val_size_negative
        unknown_mode = padding_mode not in ("constant", "reflect")
        if batches_empty or negative or unknown_mode:
            raise DataError(f"--data.batch_size {batch_size} and eval_batch_size {eval_batch_size} "
                            f"must be at least 1, crop_padding {crop_padding} and val_size "
                            f"{val_size} at least 0, padding_mode {padding_mode!r} constant or "
                            f"reflect")
        # 2.0 from a config is a count; 2.5 is neither
        if isinstance(val_size, float) and val_size >= 1:
            if not val_size.is_integer():
                raise DataError(f"--data.val_size {val_size}: a count of images, or a fraction "
                                f"between 0 and 1")
            val_size = int(val_size)
        self.data_dir, self.batch_size, self.eval_batch_size = data_dir, batch_size, eval_batch_size
        self.val_size, self.split_seed = val_size, split_seed
        self.crop_padding, self.padding_mode, self.flip = crop_padding, padding_mode, flip
        self.on_device, self.download, self.float_images = on_device, download, float_images
        self.said_floats = False
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._train_batches: Optional[DeviceBatches] = None
        self._train_state: Optional[dict] = None

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images (N, C, H, W) and int64 labels (N,) of "train", "test" (or "val", see
        has_val_split)."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def has_validation(self) -> bool:
        return self.has_val_split or self.val_size != 0

    @property
    def mean(self) -> list[float]:
        """Per-channel mean of the training images, on the 0..1 scale."""
        return self._statistics[0]

    @property
    def std(self) -> list[float]:
        """Per-channel standard deviation of the training images, on the 0..1 scale."""
        return self._statistics[1]

    @functools.cached_property
    def _statistics(self) -> tuple[list[float], list[float]]:
        return channel_stats(self._split("train")[0])

    def setup(self, stage: str) -> None:
        self.gives_floats()  # a model that does not say which images it takes stops here
        wanted = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"],
                  "predict": ["test"]}[stage]
        for split in wanted:
            if split != "val" or self.has_validation:
                self._split(split)

    def _val_count(self, n: int) -> int:
        """How many of the `n` training images `val_size` holds out for validation."""
        if self.has_val_split:
            return 0
        if self.val_size is None:
            return min(5000, n // 10)
        if self.val_size < 1:
            return round(self.val_size * n)
        return self.val_size

    def _split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A split's tensors, read on first use (one read of "train" gives both train and val) and
        kept."""
        if split not in self.splits:
            own_val = split == "val" and self.has_val_split
            if split == "test" or own_val:
                parts = {split: self.read(split)}
            else:
                images, labels = self.read("train")
                n = len(images)
                size = self._val_count(n)
                if size >= n:
                    raise DataError(f"--data.val_size {self.val_size} leaves none of the {n} "
                                    f"training images to train")
                generator = torch.Generator().manual_seed(self.split_seed)
                order = torch.randperm(n, generator=generator, device="cpu")
                parts = {"train": order[size:]}
                if not self.has_val_split:
                    parts["val"] = order[:size]
                parts = {name: (images[i], labels.index_select(0, i)) for name, i in parts.items()}
            self.splits.update(parts)
        # Read before a trainer is attached (the statistics the model takes when it is built) it
        # stays in host memory until then, and moves to the training device once.
        device = torch.device("cpu")
        if self.trainer is not None and self.on_device:
            device = torch.device(self.trainer.strategy.root_device)
        images, labels = self.splits[split]
        if images.device != device:
            self.splits[split] = images.to(device), labels.to(device)
        return self.splits[split]

    def _rank(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def train_dataloader(self) -> DeviceBatches:
        images, labels = self._split("train")
        rank, world_size = self._rank()
        if len(images) // world_size < self.batch_size:
            raise DataError(f"--data.batch_size {self.batch_size} is more than the "
                            f"{len(images) // world_size} training images of each of {world_size} "
                            f"process(es): not one full batch")
        # The seed of --seed_everything (Lightning's seed_everything sets torch's initial seed).
        # overfit_batches: the same batches every epoch, as Lightning does with a DataLoader.
        shuffle = self.trainer is None or not self.trainer.overfit_batches
        reflect = self.padding_mode == "reflect"
        if reflect and self.crop_padding >= min(images.shape[2:]):
            raise DataError(f"--data.crop_padding {self.crop_padding} reflected needs images "
                            f"larger than {tuple(images.shape[2:])}")
        batches = DeviceBatches(images, labels, self.batch_size, train=True,
                                crop_padding=self.crop_padding, reflect=reflect, flip=self.flip,
                                seed=torch.initial_seed(), rank=rank, world_size=world_size,
                                shuffle=shuffle, to_float=self.gives_floats())
        if self._train_state is not None:
            batches.load_state_dict(self._train_state)
            self._train_state = None
        self._train_batches = batches
        return batches

    # The position in the epoch, also through the data module's own state: Lightning restores that
    # before it asks for the training batches, but not the loader's own state when the model asked
    # for them first, as `trainer.estimated_stepping_batches` (OneCycle's length) does
    # (Lightning-AI/pytorch-lightning#20550).
    def state_dict(self) -> dict:
        if self._train_batches is None:
            return {}
        return {"train_batches": self._train_batches.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self._train_state = state_dict.get("train_batches")

    def gives_floats(self) -> bool:
        """Whether the batches are float images on the 0..1 scale: `float_images` as given; unset,
        what the Trainer's model says (`takes_uint8_images`), uint8 with no Trainer, and floats
        for a model that says nothing (a LightningModule as Lightning's docs write one), said in
        one line."""
        if self.float_images is not None:
            return self.float_images
        if self.trainer is None or self.trainer.lightning_module is None:
            return False
        model = self.trainer.lightning_module
        takes_uint8 = getattr(model, "takes_uint8_images", None)
        if takes_uint8 is None and not self.said_floats:
            # A model written for uint8 would otherwise be fed floats without a word.
            rank_zero_only(print)(f"{type(model).__name__} gets float32 images on the 0..1 scale, "
                                  f"as torchvision's ToTensor gives them (--data.float_images "
                                  f"false: the uint8 images; or a `takes_uint8_images` attribute "
                                  f"of the model's)", file=sys.stderr)
            self.said_floats = True
        return not takes_uint8

    def _eval_batches(self, split: str) -> DeviceBatches:
        rank, world_size = self._rank()
        return DeviceBatches(*self._split(split), self.eval_batch_size, rank=rank,
                             world_size=world_size, to_float=self.gives_floats())

    def val_dataloader(self):
        return self._eval_batches("val") if self.has_validation else []

    def test_dataloader(self) -> DeviceBatches:
        return self._eval_batches("test")

    predict_dataloader = test_dataloader  # predictions are of the test images
