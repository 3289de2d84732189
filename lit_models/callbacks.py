"""Callbacks that measure a run without slowing it down."""

import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException


class TrainingSpeed(L.Callback):
    """Logs each epoch's training time and images/s (`train/epoch_seconds`, `train/images_per_second`),
    and the peak GPU memory (`gpu/peak_memory_gb`) where there is a GPU.

    Only the training batches are timed, not validation. Lightning's ThroughputMonitor synchronises
    the GPU after every batch to time it; this synchronises once per epoch, so the training step
    keeps running ahead of the host.
    """

    def __init__(self):
        self.epoch_seconds: list[float] = []  # the training part of each epoch of this fit
        self.train_images = 0
        self.calls = 0  # training steps (calls of several optimizer steps) this process ran
        self._start = None
        self._images = 0
        self._epoch_metrics = {}

    def _sync(self, trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def on_train_epoch_start(self, trainer, pl_module):
        self._sync(trainer)
        self._images = 0
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # A chunk of (images, labels): a lazy one has counted them as it was trained on (it cannot be iterated
        # again), a list is counted here (shapes, not values: no sync).
        images = getattr(batch, "images", None)
        self._images += images if images is not None else sum(len(y) for _, y in batch)
        self.calls += 1

    def _stop(self, trainer) -> None:
        if self._start is None:
            return
        self._sync(trainer)
        seconds = time.perf_counter() - self._start
        self._start = None
        images = self._images * trainer.world_size
        self.epoch_seconds.append(seconds)
        self.train_images += images
        metrics = {"train/epoch_seconds": seconds, "train/images_per_second": images / seconds}
        if trainer.strategy.root_device.type == "cuda":
            metrics["gpu/peak_memory_gb"] = torch.cuda.max_memory_allocated(trainer.strategy.root_device) / 2**30
        self._epoch_metrics = metrics

    def on_validation_start(self, trainer, pl_module):
        # Validation runs inside the training epoch, before on_train_epoch_end: stop the clock here.
        if not trainer.sanity_checking:
            self._stop(trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        self._stop(trainer)  # for epochs without validation
        # This rank's figures (the ranks run in lockstep): logged without a collective, see ImageClassifier._log.
        pl_module.log_dict(self._epoch_metrics, on_epoch=True, batch_size=1)

    @property
    def train_seconds(self) -> float:
        return sum(self.epoch_seconds)

    @property
    def images_per_second(self) -> float:
        return self.train_images / self.train_seconds if self.train_seconds else 0.0


class LearningRateCurve(L.Callback):
    """Logs the learning rate of every `log_every_n_steps`-th optimizer step (`lr-SGD`, `lr-AdamW`, ...).

    Lightning's LearningRateMonitor logs once per Lightning step, which here holds several optimizer
    steps (`--data.steps_per_call`): the model notes the rates as it steps, and they are logged here
    against their own optimizer step.
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        history, pl_module.lr_history = pl_module.lr_history, []
        if trainer.is_global_zero:
            for step, rates in history:
                for logger in trainer.loggers:
                    logger.log_metrics(rates, step=step)


class LastCheckpoint(ModelCheckpoint):
    """checkpoints/last.ckpt at the end of every epoch, and when training is stopped by Ctrl-C or SIGTERM.

    ModelCheckpoint's own `save_last` writes last.ckpt only in epochs that also write a new best
    checkpoint, and its `save_on_exception` writes on any error (a NaN loss included), which would
    replace a good last.ckpt with a broken one. A stop between steps (SIGTERM: pre-emption, SLURM,
    `kill`) resumes exactly, mid-epoch included; Ctrl-C can land inside a step, whose batch is then
    trained on once more or not at all after resuming. A stop after an epoch's last batch and before
    the epoch ends (in or before its validation) writes nothing: Lightning would resume such a
    checkpoint without validating that epoch, so the previous last.ckpt stays, and resuming repeats it.
    """

    def __init__(self):
        super().__init__(filename="last", monitor=None, save_top_k=1, enable_version_counter=False)
        self.interrupted_path = None

    def on_exception(self, trainer, pl_module, exception):
        stopped = isinstance(exception, (KeyboardInterrupt, SIGTERMException))
        if not stopped or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking or not self.dirpath:
            return
        if trainer.fit_loop.epoch_loop.batch_progress.current.completed >= trainer.num_training_batches:
            return  # the epoch's training is done, its validation not: see above
        self.interrupted_path = self.format_checkpoint_name({})
        trainer.save_checkpoint(self.interrupted_path)
