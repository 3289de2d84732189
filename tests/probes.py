"""Callbacks and plugins that tests hand to train.py on its command line (tests/ on PYTHONPATH)."""

import errno
import os
import signal
import time

import lightning as L
from lightning.fabric.plugins import TorchCheckpointIO


class SignalAt(L.Callback):
    """Sends this process a real signal after optimizer step `step` (or at the start of testing, step -1)."""

    def __init__(self, step: int, signal_name: str = "SIGTERM"):
        self.step, self.signal = step, getattr(signal, signal_name)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signal)

    def on_test_start(self, trainer, pl_module):
        if self.step == -1:
            os.kill(os.getpid(), self.signal)


class FullDisk(TorchCheckpointIO):
    """A disk that fills up: writes `writes` checkpoints, then every write fails as a full disk does."""

    def __init__(self, writes: int = 2):
        super().__init__()
        self.writes = writes

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if self.writes <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.writes -= 1
        super().save_checkpoint(checkpoint, path, storage_options)


class SaveWeights(L.Callback):
    """Each process writes its model's weights when training ends: weights-rank<N>.pt in the working directory."""

    def on_train_end(self, trainer, pl_module):
        import torch

        torch.save(pl_module.state_dict(), f"weights-rank{trainer.global_rank}.pt")


class MemoryGrowth(L.Callback):
    """Writes memory.txt: the process's resident memory growth in MB from epoch `start` to the last epoch."""

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
    """Testing starts `seconds` late, and the file `flag` says that it has begun: a signal can land while testing."""

    def __init__(self, flag: str, seconds: float = 5):
        self.flag, self.seconds = flag, seconds

    def on_test_start(self, trainer, pl_module):
        open(self.flag, "w").close()
        time.sleep(self.seconds)
