"""Callbacks and plugins that tests hand to train.py on its command line (tests/ on PYTHONPATH)."""

import errno
import os
import signal
import time

import lightning as L
from lightning.fabric.plugins import TorchCheckpointIO


class SignalAt(L.Callback):
    """Sends this process a real signal after optimizer step `step` (or at the start of testing:
    -1, of a validation: -2, of predicting: -3; at the end of training, after its last step and
    checkpoints: -4).

    `rank`: only the process of that global rank sends it; `parent`: to its parent (a node's
    torchrun) instead."""

    def __init__(
        self, step: int, signal_name: str = "SIGTERM", rank: int | None = None, parent: bool = False
    ):
        self.step, self.signal, self.rank, self.parent = (
            step,
            getattr(signal, signal_name),
            rank,
            parent,
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(os.getppid() if self.parent else os.getpid(), self.signal)

    def on_test_start(self, trainer, pl_module):
        if self.step == -1:
            os.kill(os.getpid(), self.signal)

    def on_validation_start(
        self, trainer, pl_module
    ):  # step -2: at the start of a validation, outside training
        if self.step == -2 and not trainer.sanity_checking:
            os.kill(os.getpid(), self.signal)

    def on_predict_start(self, trainer, pl_module):
        if self.step == -3:
            os.kill(os.getpid(), self.signal)

    def on_train_end(self, trainer, pl_module):
        if self.step == -4:
            os.kill(os.getpid(), self.signal)


class FullDisk(TorchCheckpointIO):
    """A disk that fills up: writes `writes` checkpoints, then every write fails as a full disk
    does."""

    def __init__(self, writes: int = 2):
        super().__init__()
        self.writes = writes

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if self.writes <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.writes -= 1
        super().save_checkpoint(checkpoint, path, storage_options)


class SaveWeights(L.Callback):
    """Each process writes its model's weights when training ends: weights-rank<N>.pt in the
    working directory, and the class name of the cluster environment Lightning chose:
    environment-rank<N>.txt."""

    def on_train_end(self, trainer, pl_module):
        import torch

        torch.save(pl_module.state_dict(), f"weights-rank{trainer.global_rank}.pt")
        with open(f"environment-rank{trainer.global_rank}.txt", "w") as f:
            f.write(type(trainer.strategy.cluster_environment).__name__)


class MemoryGrowth(L.Callback):
    """Writes memory.txt: the process's resident memory growth in MB from epoch `start` to the
    last epoch."""

    def __init__(self, start: int = 20):
        self.start, self.first = start, None

    @staticmethod
    def resident_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.start:
            self.first = self.resident_mb()

    def on_train_end(self, trainer, pl_module):
        with open("memory.txt", "w") as f:
            f.write(f"{self.resident_mb() - self.first:.2f}")


class SlowTest(L.Callback):
    """The first testing to begin (no file `flag` yet) starts `seconds` late, and `flag` says that
    it has begun: a signal can land while testing. Later ones (the same command again) do not
    wait."""

    def __init__(self, flag: str, seconds: float = 5):
        self.flag, self.seconds = flag, seconds

    def on_test_start(self, trainer, pl_module):
        if not os.path.exists(self.flag):
            open(self.flag, "w").close()
            time.sleep(self.seconds)


class SignalAsTheFitStarts(L.Callback):
    """Sends this process SIGTERM in on_fit_start, before Lightning's SIGTERM handler is in place,
    then writes "done" to `flag`: the rest of what it was doing, as a library's code would finish
    what a signal interrupted (TensorBoard's writer putting an event on its queue)."""

    def __init__(self, flag: str):
        self.flag = flag

    def on_fit_start(self, trainer, pl_module):
        os.kill(os.getpid(), signal.SIGTERM)
        with open(self.flag, "w") as file:
            file.write("done")


class SignalAtBatch(L.Callback):
    """Sends this process a real signal as batch `batch` of a stage starts (`stage`: train,
    validation, test or predict; `batch` -1: the stage's last batch). Sanity checks do not count."""

    def __init__(self, stage: str, batch: int, signal_name: str = "SIGTERM"):
        self.stage, self.batch, self.signal = stage, batch, getattr(signal, signal_name)
        self.sent = False

    def maybe(self, trainer, stage: str, batch_idx: int, batches) -> None:
        if isinstance(batches, list):  # one count per loader
            batches = batches[0]
        wanted = self.batch if self.batch >= 0 else int(batches) - 1
        now = stage == self.stage and batch_idx == wanted and not trainer.sanity_checking
        if now and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signal)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.maybe(trainer, "train", batch_idx, trainer.num_training_batches)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.maybe(trainer, "validation", batch_idx, trainer.num_val_batches)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.maybe(trainer, "test", batch_idx, trainer.num_test_batches)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.maybe(trainer, "predict", batch_idx, trainer.num_predict_batches)
