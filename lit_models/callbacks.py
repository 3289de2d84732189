"""Callbacks of the recipes: the latest checkpoint (also on SIGTERM), the training speed, a progress
bar, EMA."""

import math
import signal
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar, WeightAveraging
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.optim.swa_utils import get_ema_multi_avg_fn


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt`: the end of the latest epoch, or where SIGTERM (pre-emption, `scancel`, the first
    Ctrl-C of train.py) stopped a fit, between two steps or in a validation, where the state is
    whole: `--ckpt_path last` goes on from there. Other exceptions save nothing (ModelCheckpoint's
    `save_on_exception` would save a diverged model over a good one); ModelCheckpoint's own
    `save_last` writes only in epochs that write a new best.

    Args:
        filename: the checkpoint's name, without `.ckpt`.
        every_n_train_steps: also save every N optimizer steps (0: at epoch ends only).
    """

    def __init__(self, filename: str = "last", every_n_train_steps: int = 0):
        super().__init__(
            filename=filename,
            monitor=None,
            save_top_k=1,
            enable_version_counter=False,
            every_n_train_steps=every_n_train_steps or None,
        )
        self.saved_on_stop: str | None = None

    def on_exception(self, trainer, pl_module, exception):
        # In validation too: Lightning resumes a fit in the middle of its validation as well.
        self.saved_on_stop = None
        # Before its first step (reading the data, the sanity check) a fit has nothing to go on
        # from, and no folder of its own yet: the same command starts it again.
        stepped = trainer.global_step > 0 and self.dirpath is not None
        if isinstance(exception, SIGTERMException) and fitting(trainer) and stepped:
            trainer.save_checkpoint(self.format_checkpoint_name({}), weights_only=False)
            self.saved_on_stop = self.format_checkpoint_name({})

    # Several processes: a SIGTERM that reaches some of them (a node's torchrun passes it to its own
    # only) is noted, and Lightning's handler runs in every process at once at a step's end. Run
    # where the signal lands, mid-step, its broadcast meets another collective: the processes hang
    # and nothing is saved (docs/multi-node.md).
    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self.sigterm, self.lightning_sigterm = False, None
        if trainer.world_size > 1:
            self.lightning_sigterm = signal.signal(signal.SIGTERM, self.note_sigterm)

    def note_sigterm(self, signum, frame):
        self.sigterm = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.lightning_sigterm is None:
            return
        if trainer.strategy.reduce_boolean_decision(self.sigterm, all=False):
            # Lightning's handler sets trainer.received_sigterm: Lightning stops after this step.
            self.lightning_sigterm(signal.SIGTERM, None)


def fitting(trainer) -> bool:
    """In a fit's training or validation, not in its sanity check."""
    return trainer.state.fn == "fit" and not trainer.sanity_checking


class TrainingSpeed(L.Callback):
    """Logs each epoch's training time and images per second (`train/epoch_seconds`,
    `train/images_per_second`).

    Only the training batches are timed (the clock stops when validation starts). Lightning's
    ThroughputMonitor waits for the GPU after every batch to time it; this waits once per epoch, so
    training runs ahead of the host.
    """

    def __init__(self):
        self.epoch_seconds: list[float] = []
        self.images = 0
        # This epoch's seconds and images, and the clock while it runs.
        self._seconds = 0.0
        self._images = 0
        self._start: float | None = None

    def _now(self, trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module):
        self._seconds, self._images = 0.0, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # The epoch's first batch, or the first after a validation or a resume.
        if self._start is None:
            self._start = self._now(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._images += batch_size(batch)

    def on_validation_start(self, trainer, pl_module):
        # The clock stops for validation, also mid-epoch (val_check_interval).
        if self._start is not None:
            self._seconds += self._now(trainer) - self._start
            self._start = None

    def on_train_epoch_end(self, trainer, pl_module):
        self.on_validation_start(trainer, pl_module)
        if self._seconds > 0:
            images = self._images * trainer.world_size
            self.epoch_seconds.append(self._seconds)
            self.images += images
            pl_module.log_dict({
                "train/epoch_seconds": self._seconds,
                "train/images_per_second": images / self._seconds,
            })

    @property
    def images_per_second(self) -> float:
        """Over every epoch trained by this fit."""
        if not self.epoch_seconds:
            return 0.0
        return self.images / sum(self.epoch_seconds)


def batch_size(batch) -> int:
    """A batch's images, from a shape, not a value (no wait for the device): (images, labels) as
    the data modules give them, or what Lightning finds in any other batch."""
    if isinstance(batch, (list, tuple)):
        return len(batch[0])
    return extract_batch_size(batch)


class TimedProgressBar(TQDMProgressBar):
    """Lightning's TQDMProgressBar, redrawn at most `refresh_seconds` apart, and at the end of each
    bar: Lightning's redraw after every batch, a measurable share of a tutorial network's step
    (docs/benchmarks.md), and in a file (SLURM, CI, nohup) every redraw stays.

    Args:
        refresh_seconds: the least time between two redraws; None: 0.1 in a terminal, 30 otherwise.
    """

    def __init__(self, refresh_seconds: float | None = None):
        super().__init__()
        if refresh_seconds is None:
            # sys.stdout: where Lightning's bars write.
            refresh_seconds = 0.1 if sys.stdout.isatty() else 30.0
        self.refresh_seconds = refresh_seconds
        self._drawn = -math.inf

    def _should_update(self, current: int, total: int | None) -> bool:
        # What Lightning's bar asks at every batch of every stage: a private method, which
        # docs/design.md names.
        now = time.monotonic()
        if self.is_enabled and self._redraw_due(now, current, total):
            self._drawn = now
            return True
        return False

    def _redraw_due(self, now: float, current: int, total: int | None) -> bool:
        """`refresh_seconds` since the last redraw, or the end of a bar of known length."""
        at_end = total is not None and current >= total
        return now - self._drawn >= self.refresh_seconds or at_end


class EMA(WeightAveraging):
    """Lightning's WeightAveraging as an exponential moving average of the weights
    (`--trainer.callbacks+=EMA`).

    Updated after every optimizer step from `start_step` on; validation, checkpoints, testing and
    everything after training use the averaged weights (WeightAveraging swaps them in). Only a
    subclass because WeightAveraging takes its averaging function as a callable, which a command
    line cannot give.

    Args:
        decay: the weight of the average so far at each update (0.999: about the last 1000 steps).
        start_step: the optimizer step of the first update.
    """

    def __init__(self, decay: float = 0.999, start_step: int = 0):
        super().__init__(multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.start_step = start_step

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx >= self.start_step
