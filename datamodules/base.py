"""What every data module shares: a seeded validation split, the training images' statistics, and
batches cut from uint8 tensors that live on the training device, augmented there. And the one way
a data file is read (`reading`) and a data set downloaded (`ImageDataModule.fetch`)."""

import contextlib
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


@contextlib.contextmanager
def reading(path, fix: str):
    """A block that reads the data file `path`: whatever its reader raises (an OSError, a pickle,
    gzip or zlib error, an EOFError, a shape its bytes do not fill...) ends in one DataError line
    that names the file, says what went wrong in a few words, and `fix`: how to get a whole copy.
    One wrapper for every format, in place of checks of each format's bytes."""
    try:
        yield
    except Exception as e:
        reason = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"  # "Permission denied"
        raise DataError(f"cannot read {path} ({reason.strip().splitlines()[0]}); {fix}") from e


def channel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of uint8 images (N, C, H, W), on the 0..1 scale,
    exactly (from a 256-bin histogram per channel, in float64)."""
    channels = images.shape[1]
    step = max(1, (1 << 24) // math.prod(images.shape[1:]))  # parts of 16 MB
    # On the host, whatever the default device: Lightning calls configure_model, which asks for
    # these, with the training device as the default.
    counts = torch.zeros(channels, 256, dtype=torch.float64, device="cpu")
    for rows in torch.arange(len(images), device=images.device).split(step):
        # `images`: a tensor or DiskImages; counted as uint8, no wider copy
        values = images.index_select(0, rows).transpose(0, 1).reshape(channels, -1).cpu()
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
        self.shuffle, self.crop_padding, self.reflect = shuffle and train, crop_padding, reflect
        self.flip, self.seed, self.rank, self.world_size = flip, seed, rank, world_size
        self.to_float, self.epoch, self.yielded, self._resume = to_float, 0, 0, None
        self.num_samples = len(images) // world_size
        self.num_batches = self.num_samples // batch_size
        # Evaluation: each rank a contiguous part, every image once, the last batch short.
        rows = torch.arange(len(images), device=images.device)
        self.indices = rows.tensor_split(world_size)[rank]
        if not train:
            self.num_batches = math.ceil(len(self.indices) / batch_size)

    # Lightning calls `loader.sampler.set_epoch(e)` on any loader, and reads `batch_sampler` where
    # it finds a sampler.
    batch_sampler = None
    sampler = property(lambda self: self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self.yielded}

    def load_state_dict(self, state: Optional[dict]) -> None:
        self._resume = state

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        device = self.images.device
        generator = torch.Generator(device=device)
        resume, self._resume = self._resume or {}, None
        start = resume.get("batches", 0) if resume.get("epoch") == self.epoch else 0
        order = torch.arange(len(self.images), device=device) if self.train else self.indices
        if self.shuffle:
            generator.manual_seed(mix_seed(self.seed, self.epoch))
            order = torch.randperm(len(self.images), device=device, generator=generator)
        if self.train:
            order = order[self.rank::self.world_size][:self.num_samples]
        for i in range(start, self.num_batches):
            index = order[i * self.batch_size:(i + 1) * self.batch_size]
            # index_select, not images[index]: on a CPU advanced indexing of uint8 images is many
            # times slower.
            images = self.images.index_select(0, index)
            if self.crop_padding or self.flip:  # any batch, in any order
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
    (`prepare_data`, `read(split)`).

    Each split is read once into uint8 tensors (N, C, H, W), moved to the training device
    (`on_device`), and batched there by DeviceBatches. A seeded split of the training images
    validates; the test set is only ever tested on. `mean` and `std` are the training images'
    statistics, the model's default normalisation. A checkpoint holds the training batches'
    position and what it means (`state_dict`); a fit that resumes from one where that position
    would mean other images is refused (`resume`).

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

    name: str = ""  # the data set's short name, in records
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
        # 2.0 from a config is a count; 2.5 is neither
        fractional_count = isinstance(val_size, float) and val_size >= 1 and val_size % 1
        out_of_range = min(batch_size, eval_batch_size) < 1 or min(crop_padding, val_size or 0) < 0
        if out_of_range or fractional_count:
            raise DataError(f"--data.batch_size {batch_size} and eval_batch_size {eval_batch_size} "
                            f"must be at least 1, crop_padding {crop_padding} at least 0, val_size "
                            f"{val_size}: a count of images, or a fraction between 0 and 1")
        if isinstance(val_size, float) and val_size >= 1:
            val_size = int(val_size)
        self.data_dir, self.batch_size, self.eval_batch_size = data_dir, batch_size, eval_batch_size
        self.val_size, self.split_seed, self.crop_padding = val_size, split_seed, crop_padding
        self.padding_mode, self.flip, self.on_device = padding_mode, flip, on_device
        self.download, self.float_images, self.said_floats = download, float_images, False
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._train_batches: Optional[DeviceBatches] = None
        self._saved: Optional[dict] = None  # the state of the checkpoint a fit resumes from

    def read(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images (N, C, H, W) and int64 labels (N,) of "train", "test" (or "val", see
        has_val_split)."""
        raise NotImplementedError

    def fetch(self, absent: str, download, put: str, where) -> None:
        """Download the data set, `absent` (a few words say what is missing), by `download()`; a
        DataError where --data.download is false or the download fails, which says where to `put`
        the files (the folder `where`) by hand."""
        if not self.download:
            raise DataError(f"{absent} (and --data.download is false)")
        try:
            download()
        except (OSError, RuntimeError) as e:  # no network, a full disk, a refused md5
            if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise DataError(f"{e.filename} cannot be written ({e.strerror}): the data set is "
                                f"downloaded into {where}; pass a --data.data_dir that can be "
                                f"written, or put the files there yourself") from None
            said = (str(e).strip().splitlines() or [type(e).__name__])[-1]  # one line per mirror
            raise DataError(f"{absent} and could not be downloaded ({said}). {put}, "
                            f"or pass --data.data_dir with the folder that holds it") from None

    num_classes = property(lambda self: len(self.classes))
    # whether the data module validates: on its own validation set, or on training images split off
    has_validation = property(lambda self: self.has_val_split or self.val_size != 0)

    # The training images' per-channel mean and standard deviation, on the 0..1 scale.
    mean = property(lambda self: self._statistics[0])
    std = property(lambda self: self._statistics[1])

    @functools.cached_property
    def _statistics(self) -> tuple[list[float], list[float]]:
        return channel_stats(self._split("train")[0])

    def setup(self, stage: str) -> None:
        self.gives_floats()  # a model that does not say which images it takes stops here
        if stage == "fit":
            self._saved = None  # until Lightning restores a checkpoint's (load_state_dict)
        for split in {"fit": ["train", "val"], "validate": ["val"]}.get(stage, ["test"]):
            if split != "val" or self.has_validation:
                self._split(split)

    def _val_count(self, n: int) -> int:
        """How many of the `n` training images `val_size` holds out for validation."""
        if self.has_val_split:
            return 0
        if self.val_size is None:
            return min(5000, n // 10)
        return round(self.val_size * n) if self.val_size < 1 else self.val_size

    def _split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A split's tensors, read on first use (one read of "train" gives both train and val) and
        kept."""
        if split not in self.splits:
            if split == "test" or (split == "val" and self.has_val_split):
                parts = {split: self.read(split)}
            else:
                images, labels = self.read("train")
                n, size = len(images), self._val_count(len(images))
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
        device = "cpu"
        if self.trainer is not None and self.on_device:
            device = self.trainer.strategy.root_device
        images, labels = self.splits[split]  # where they are already: themselves, not copies
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
        reflect = self.padding_mode == "reflect"
        if reflect and self.crop_padding >= min(images.shape[2:]):
            raise DataError(f"--data.crop_padding {self.crop_padding} reflected needs images "
                            f"larger than {tuple(images.shape[2:])}")
        # The seed of --seed_everything (Lightning's seed_everything sets torch's initial seed).
        # overfit_batches: the same batches every epoch, as Lightning does with a DataLoader.
        batches = DeviceBatches(images, labels, self.batch_size, train=True,
                                crop_padding=self.crop_padding, reflect=reflect, flip=self.flip,
                                seed=torch.initial_seed(), rank=rank, world_size=world_size,
                                shuffle=self.trainer is None or not self.trainer.overfit_batches,
                                to_float=self.gives_floats())
        self.resume(batches)
        self._train_batches = batches
        return batches

    # The position in the epoch, also through the data module's own state: Lightning restores that
    # before it asks for the training batches, but not the loader's own state when the model asked
    # for them first, as `trainer.estimated_stepping_batches` (OneCycle's length) does
    # (Lightning-AI/pytorch-lightning#20550).
    def state_dict(self) -> dict:
        """The training batches' position, and what it means: the data set, its number of training
        images, the batch size and processes, and the batches an epoch trains."""
        batches = self._train_batches
        if batches is None:
            return {"data": type(self).__name__}
        per_epoch = len(batches)
        if self.trainer is not None:  # fewer with limit_train_batches
            per_epoch = min(per_epoch, self.trainer.num_training_batches)
        return {**self._meaning(batches), "train_batches": batches.state_dict(),
                "batches_per_epoch": per_epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        self._saved = state_dict

    def _meaning(self, batches: DeviceBatches) -> dict:
        return {"data": type(self).__name__, "train_images": len(batches.images),
                "batch_size": batches.batch_size, "world_size": batches.world_size}

    def resume(self, batches: DeviceBatches) -> None:
        """Start `batches` where the checkpoint a fit resumes from stopped, or refuse in one line
        a position that would mean other images: of another data set (Lightning restores only a
        state of this class), of another number of training images, or saved mid-epoch with
        another batch size or number of processes. What an older checkpoint lacks is not
        compared."""
        trainer = self.trainer
        resuming = trainer is not None and trainer.state.fn == "fit" and trainer.ckpt_path
        checkpoint = trainer.ckpt_path if resuming else "the checkpoint"
        if resuming and self._saved is None:
            raise DataError(f"{checkpoint} holds no position in the batches of "
                            f"{type(self).__name__}: it was saved by a fit on other data; resume "
                            f"it with the --data it was saved with, or start a new run")
        now = self._meaning(batches)
        saved = {**now, **(self._saved or {})}
        changed = {key for key, value in now.items() if saved[key] != value}
        if changed & {"data", "train_images"}:
            raise DataError(f"{checkpoint} was saved on {saved['train_images']} training images of "
                            f"{saved['data']}, not {now['train_images']} of {now['data']}: resume "
                            f"it with the data and --data.val_size it was saved with, or start a "
                            f"new run")
        position = saved.get("train_batches") or {}
        if changed and 0 < position.get("batches", 0) < saved.get("batches_per_epoch", 0):
            raise DataError(f"{checkpoint} was saved mid-epoch (batch {position['batches']} of "
                            f"{saved['batches_per_epoch']}) in batches of {saved['batch_size']} on "
                            f"{saved['world_size']} process(es), not {now['batch_size']} on "
                            f"{now['world_size']}: resume it with --data.batch_size "
                            f"{saved['batch_size']}, or start a new run")
        batches.load_state_dict(position)

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
        validating = self.trainer is not None and self.trainer.state.fn == "validate"
        if validating and not self.has_validation:  # Lightning would validate nothing, and say so
            raise DataError("there is no validation set to validate on (--data.val_size 0?): "
                            "test instead, or give the data a --data.val_size")
        return self._eval_batches("val") if self.has_validation else []

    def test_dataloader(self) -> DeviceBatches:
        return self._eval_batches("test")

    predict_dataloader = test_dataloader  # predictions are of the test images
