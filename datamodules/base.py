"""What every data module shares: a uint8 tensor cache, a seeded validation split, normalisation, and
batching either on the device (default) or through a classic DataLoader."""

import math
import os
from pathlib import Path
from typing import Optional

import lightning as L
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt

from datamodules import cache
from datamodules.chunks import StepChunks
from datamodules.device_batches import DeviceBatches
from datamodules.loader_batches import LoaderBatches, SeededImages, evaluation_loader

# Optimizer steps per Lightning step when --data.steps_per_call is not given. Lightning costs ~0.3 ms a step
# on a CPU, against 5-8 ms for a step of the tutorial networks at the recipes' batch sizes: 8 steps a call
# make it 0.5% of the time. On a GPU a step of these networks takes tens of microseconds.
DEFAULT_STEPS_PER_CALL = {"cpu": 8, "cuda": 64}

# The splits this process has decoded or read from the cache, by cache file (and its identity on disk: a
# rewritten file is read again) and source key. The tensors are never written to (every split is copied out
# of them), so the trials of a sweep, which run one after another in one worker process, read a data set once.
_DECODED: dict[tuple[Path, str, tuple | None], dict] = {}


def file_identity(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation of uint8 images (N, C, H, W), on the 0..1 scale.

    From a 256-bin histogram per channel: exact, and 8x faster than summing floats (CIFAR-10: 0.1 s).
    """
    channels = images.shape[1]
    counts = torch.zeros(channels, 256, dtype=torch.float64)
    for start in range(0, len(images), chunk):
        part = images[start:start + chunk].transpose(0, 1).reshape(channels, -1).long()
        part += 256 * torch.arange(channels).unsqueeze(1)  # one bincount for all channels
        counts += torch.bincount(part.flatten(), minlength=256 * channels).view(channels, 256)
    values = torch.arange(256, dtype=torch.float64) / 255
    total = counts.sum(1)
    mean = (counts * values).sum(1) / total
    var = (counts * values.square()).sum(1) / total - mean.square()
    return mean.float(), var.clamp(min=0).sqrt().float()


class DataSetupError(RuntimeError):
    """The data cannot be found, fetched or read; the message says what to do about it."""


def download_failure(error: Exception) -> str:
    """The last line of a download error: torchvision's run to several lines, one per mirror."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


class ImageDataModule(L.LightningDataModule):
    """Base of the image data modules: subclasses say how to fetch and decode their data set.

    A data set is decoded once into uint8 tensors (N, C, H, W) that are cached under
    `data_dir/cache/`; later runs load the cache in a fraction of a second. The cache is rebuilt when
    the source files change. A seeded `val_size` split of the training set is the validation set;
    the test set is only ever tested on.

    Args:
        data_dir: where the data set is (or is downloaded to).
        batch_size: training batch size, per device.
        eval_batch_size: validation and test batch size, per device.
        val_size: images split off the training set for validation; 0: no validation, every training
            image trains, and the last checkpoint is the one tested.
        split_seed: seed of that split (fixed, so that runs with other seeds validate on the same images).
        mean: per-channel mean of the input normalisation, on the 0..1 scale; by default the training
            images' own (the tutorials use 0.5).
        std: per-channel standard deviation of the normalisation, likewise.
        on_device: keep the whole data set on the training device and batch it there (fast); false
            uses a DataLoader with worker processes, for data that does not fit on the device.
        num_workers: DataLoader worker processes (classic path only).
        crop_padding: random-crop augmentation: pad by this many pixels, crop back at a random offset
            (0: off).
        flip: random horizontal flips.
        steps_per_call: training batches per Lightning step (each gets its own optimizer step); by
            default 8 on a CPU and 64 on a GPU, where a step is short next to Lightning's cost of a call.
            Results do not depend on it.
        download: download the data set if it is missing.
        seed: shuffling and augmentation seed (linked from --seed_everything).
        accumulate_grad_batches: batches per optimizer step (linked from --trainer.accumulate_grad_batches).
    """

    name: str = ""
    classes: list[str] = []

    def __init__(self, data_dir: str = "./data", batch_size: PositiveInt = 128,
                 eval_batch_size: PositiveInt = 1000, val_size: NonNegativeInt = 5000, split_seed: int = 0,
                 mean: Optional[list[float]] = None, std: Optional[list[float]] = None,
                 on_device: bool = True, num_workers: NonNegativeInt = 2, crop_padding: NonNegativeInt = 0,
                 flip: bool = False, steps_per_call: Optional[PositiveInt] = None, download: bool = True,
                 seed: NonNegativeInt = 0, accumulate_grad_batches: PositiveInt = 1):
        super().__init__()
        self.save_hyperparameters()
        self.data_dir = Path(data_dir).expanduser()
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.val_size, self.split_seed = val_size, split_seed
        self._mean, self._std = mean, std
        self.on_device, self.num_workers = on_device, num_workers
        self.crop_padding, self.flip = crop_padding, flip
        self.steps_per_call = steps_per_call
        self.download, self.seed, self.accumulate_grad_batches = download, seed, accumulate_grad_batches
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._loaded: dict[str, dict] = {}
        self._train_chunks: StepChunks | None = None  # the latest training batches, whose position checkpoints keep
        self._train_resume_state = None
        self._limit_train_batches = None  # the trainer's, as the user gave it (see _train_steps)

    # --- what a subclass provides --------------------------------------------------------------

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of the images, known before any data is read."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def has_validation_split(self) -> bool:
        """Whether the data set brings its own "val" split; if not, `val_size` images of "train" are."""
        return False

    def source_files(self, split: str) -> list[Path]:
        """The files the `split` ("train", "test", or "val" if it has one) is decoded from."""
        raise NotImplementedError

    def fetch(self) -> None:
        """Download the data set into `data_dir`; raise DataSetupError saying what to do if that fails."""
        raise NotImplementedError

    def writable_data_dir(self) -> Path:
        """`data_dir`, created if need be; a DataSetupError if nothing can be downloaded into it."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataSetupError(f"--data.data_dir {self.data_dir} cannot be created ({e.strerror}), so "
                                 f"{self.name} cannot be downloaded into it") from None
        if not os.access(self.data_dir, os.W_OK):
            raise DataSetupError(f"--data.data_dir {self.data_dir} is not writable, so {self.name} "
                                 f"cannot be downloaded into it")
        return self.data_dir

    def decode(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Read `split` from the source files: uint8 images (N, C, H, W) and int64 labels (N,)."""
        raise NotImplementedError

    # --- what the model is linked to -------------------------------------------------------------

    @property
    def has_validation(self) -> bool:
        """Whether there is a validation set: a "val" split of the data set's own, or val_size > 0."""
        return self.has_validation_split or self.val_size is None or self.val_size > 0  # None: a default share

    @property
    def mean(self) -> list[float]:
        """Per-channel mean of the normalisation: --data.mean, or the training images' (read from the cache)."""
        return list(self._mean) if self._mean is not None else self.load_split("train")["mean"].tolist()

    @property
    def std(self) -> list[float]:
        """Per-channel standard deviation of the normalisation, likewise."""
        return list(self._std) if self._std is not None else self.load_split("train")["std"].tolist()

    # --- the cache -----------------------------------------------------------------------------

    def cache_path(self, split: str) -> Path:
        """Where the decoded `split` is cached."""
        return self.data_dir / "cache" / f"{self.name}-{split}.pt"

    def load_split(self, split: str) -> dict:
        """The cached tensors of `split`, decoding (and downloading, if allowed) when needed."""
        if split not in self._loaded:  # prepare_data, setup and the links to the model may all ask
            self._loaded[split] = self._load_split(split)
        return self._loaded[split]

    def _load_split(self, split: str) -> dict:
        files = self.source_files(split)
        if not all(f.is_file() for f in files):
            if not self.download:
                missing = ", ".join(str(f) for f in files if not f.is_file())
                raise DataSetupError(f"{self.name}: missing {missing} (and --data.download is false)")
            self.fetch()
            files = self.source_files(split)
        key = cache.source_key(files)
        path = self.cache_path(split)
        memo = (path, key, file_identity(path))
        if memo in _DECODED:  # this process read it already (a sweep runs many trials per process)
            return _DECODED[memo]
        cached = cache.load(path, key)
        if cached is not None:
            _DECODED[memo] = cached
            return cached
        try:
            images, labels = self.decode(split)
        except DataSetupError:
            raise
        except Exception as e:  # whatever a reader raises on a truncated or foreign file
            what = ", ".join(str(f) for f in files) if len(files) <= 6 else f"the files in {self.data_dir}"
            raise DataSetupError(f"{self.name}: cannot read {what} ({type(e).__name__}: {e}); they may be "
                                 f"truncated or corrupt. Move them away and run again to download them "
                                 f"afresh.") from None
        mean, std = channel_stats(images)
        cached = {"key": key, "images": images.contiguous(), "labels": labels.long(), "mean": mean, "std": std}
        cache.save(path, cached)
        _DECODED[path, key, file_identity(path)] = cached
        return cached

    # --- Lightning hooks ------------------------------------------------------------------------

    def prepare_data(self):
        # Lightning runs this once per node, before setup() on every rank: download and cache here.
        for split in ("train", "test", "val") if self.has_validation_split else ("train", "test"):
            self.load_split(split)

    def setup(self, stage: str | None = None):
        # Testing or using a checkpoint reads no training images; a fit builds all three splits at once (one
        # permutation splits train and val), and fit then test reuses the tensors already on the device.
        wanted = {"validate": ["val"], "test": ["test"], "predict": ["test"]}.get(stage, ["train", "val", "test"])
        for split in wanted:
            if split not in self.splits and (split != "val" or self.has_validation):
                self.splits.update(self._build(split))

    def _build(self, split: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if split == "test" or (split == "val" and self.has_validation_split):
            data = self.load_split(split)
            built = {split: (data["images"].clone(), data["labels"].clone())}
        else:  # train and val: a seeded split of the training images
            train = self.load_split("train")
            if self.val_size >= len(train["images"]):
                raise DataSetupError(f"--data.val_size {self.val_size} leaves no training images "
                                     f"({len(train['images'])} in all)")
            generator = torch.Generator().manual_seed(self.split_seed)
            order = torch.randperm(len(train["images"]), generator=generator)
            parts = {"val": order[:self.val_size], "train": order[self.val_size:]}
            if self.has_validation_split:
                parts = {"train": torch.arange(len(train["images"]))}
            # index_select, as in DeviceBatches: advanced indexing of uint8 images is 2-3x slower on a CPU.
            built = {name: (train["images"].index_select(0, idx), train["labels"].index_select(0, idx))
                     for name, idx in parts.items() if name == split or name not in self.splits}
        if self.on_device:
            device = self.trainer.strategy.root_device if self.trainer else torch.device("cpu")
            built = {k: (x.to(device), y.to(device)) for k, (x, y) in built.items()}
        return built

    def effective_batch_size(self, trainer) -> int:
        """Images per optimizer step: the batch of every process, times the batches accumulated."""
        return self.batch_size * trainer.world_size * self.accumulate_grad_batches

    def _rank(self) -> tuple[int, int]:
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)

    def _stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.mean), torch.tensor(self.std)

    def _train_batches(self):
        images, labels = self.splits["train"]
        rank, world_size = self._rank()
        if len(images) // world_size < self.batch_size:
            raise DataSetupError(f"--data.batch_size {self.batch_size} is larger than the {len(images)} training "
                                 f"images{f' shared by {world_size} processes' if world_size > 1 else ''}; "
                                 f"choose a smaller one")
        mean, std = self._stats()
        if self.on_device:
            return DeviceBatches(images, labels, self.batch_size, mean, std, shuffle=True,
                                 crop_padding=self.crop_padding, flip=self.flip, seed=self.seed, rank=rank,
                                 world_size=world_size)
        dataset = SeededImages(images, labels, mean, std, self.crop_padding, self.flip, self.seed)
        return LoaderBatches(dataset, self.batch_size, self.seed, rank, world_size, self.num_workers,
                             pin_memory=torch.cuda.is_available())

    def _train_steps(self, batches_per_epoch: int) -> int:
        """Training batches an epoch under the trainer's `limit_train_batches`, counted as Lightning counts them.

        Lightning applies the limit to the calls (chunks of batches) it is handed; a fraction would then cut
        the batches twice. It is applied here to the batches, and Lightning is told the resulting calls.
        """
        trainer = self.trainer
        if trainer is None:
            return batches_per_epoch
        if self._limit_train_batches is None:
            self._limit_train_batches = trainer.limit_train_batches
        limit = self._limit_train_batches
        steps = min(batches_per_epoch, limit) if isinstance(limit, int) else int(batches_per_epoch * limit)
        if limit > 0 and steps == 0:
            raise DataSetupError(f"--trainer.limit_train_batches {limit} leaves none of the {batches_per_epoch} "
                                 f"training batches; use at least {1 / batches_per_epoch:.3g} or an integer")
        return steps

    def _choose_steps_per_call(self, steps: int) -> int:
        if self._train_resume_state and "steps_per_call" in self._train_resume_state:
            # The epoch being resumed was cut into chunks of this size: Lightning's count of calls assumes it.
            return self._train_resume_state["steps_per_call"]
        device = self.trainer.strategy.root_device.type if self.trainer else "cpu"
        k = self.steps_per_call or DEFAULT_STEPS_PER_CALL.get(device, 1)
        # A whole number of accumulation groups per call, so that a stop between calls never lands inside
        # one (its partial gradients are in no checkpoint).
        k = math.ceil(k / self.accumulate_grad_batches) * self.accumulate_grad_batches
        return max(1, min(k, steps))

    def train_dataloader(self):
        batches = self._train_batches()
        steps = self._train_steps(len(batches))
        chunks = StepChunks(batches, self._choose_steps_per_call(steps), steps)
        if self.trainer is not None and isinstance(self._limit_train_batches, float):
            self.trainer.limit_train_batches = len(chunks)  # see _train_steps
        if self._train_resume_state is not None:
            chunks.load_state_dict(self._train_resume_state)
            self._train_resume_state = None
        self._train_chunks = chunks
        return chunks

    @property
    def steps_per_call_used(self) -> int | None:
        """The chunk size of the latest training batches (for results.json)."""
        return self._train_chunks.steps_per_call if self._train_chunks else None

    # The position in the training epoch goes into checkpoints through the data module's own state:
    # Lightning restores it before it asks for the training batches, which it does not do for the
    # loaders' own state (our model asks for them in configure_optimizers, to plan the LR schedule).
    def state_dict(self) -> dict:
        return {"train_batches": self._train_chunks.state_dict()} if self._train_chunks is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._train_resume_state = state_dict.get("train_batches")

    def _eval_batches(self, split: str):
        images, labels = self.splits[split]
        rank, world_size = self._rank()
        mean, std = self._stats()
        if self.on_device:
            return DeviceBatches(images, labels, self.eval_batch_size, mean, std, rank=rank, world_size=world_size)
        return evaluation_loader(SeededImages(images, labels, mean, std), self.eval_batch_size, rank, world_size,
                                 self.num_workers, pin_memory=torch.cuda.is_available())

    def val_dataloader(self):
        return self._eval_batches("val") if self.has_validation else []

    def test_dataloader(self):
        return self._eval_batches("test")

    def predict_dataloader(self):
        return self._eval_batches("test")
