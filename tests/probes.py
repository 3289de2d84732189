"""Callbacks that tests add to a run from the command line (`--trainer.callbacks+=...`)."""

import json
import os
import signal
from pathlib import Path

import lightning as L
import torch


class OnceAtStep(L.Callback):
    """Acts once, after the first call (of --data.steps_per_call optimizer steps) that reaches global step `step`."""

    def __init__(self, step: int):
        self.step, self.done = step, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and not self.done:
            self.done = True
            self.act(trainer, pl_module)

    def act(self, trainer, pl_module):
        raise NotImplementedError


class SigtermAtStep(OnceAtStep):
    """Send this process SIGTERM after global step `step`: what a scheduler's pre-emption does."""

    def act(self, trainer, pl_module):
        if trainer.is_global_zero:
            os.kill(os.getpid(), signal.SIGTERM)


class NanLossAtStep(OnceAtStep):
    """Poison the weights after global step `step`, so that the next loss is NaN."""

    def act(self, trainer, pl_module):
        with torch.no_grad():
            next(pl_module.parameters()).fill_(float("nan"))


class SaveWeights(L.Callback):
    """Write each rank's final weights and sample counts to DIR/rank<r>.json."""

    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir)

    def on_train_end(self, trainer, pl_module):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        weights = {k: v.flatten().tolist() for k, v in pl_module.net.state_dict().items()}
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps({
            "world_size": trainer.world_size, "weights": weights, "global_step": trainer.global_step,
            "train_batches": trainer.train_dataloader.num_steps}))


class InterruptAtStep(OnceAtStep):
    """Press Ctrl-C (SIGINT to this process) after global step `step`."""

    def act(self, trainer, pl_module):
        os.kill(os.getpid(), signal.SIGINT)


class DiskFullAfterEpoch(L.Callback):
    """From the end of epoch `epoch` on, every file written through fsspec (Lightning's checkpoints) fails half-way
    with ENOSPC, as on a full disk: half of the bytes land, then the write raises."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch != self.epoch:
            return
        import errno

        from fsspec.implementations.local import LocalFileOpener

        def full(opener, data):
            opener.f.write(bytes(data)[: len(data) // 2])
            opener.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        LocalFileOpener.write = full


class SigtermDuringFirstValidation(L.Callback):
    """Send this process SIGTERM at the first validation batch after training started."""

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and batch_idx == 0 and trainer.current_epoch == 0:
            os.kill(os.getpid(), signal.SIGTERM)


class SignalDuringTest(L.Callback):
    """Send this process `signal_name` (SIGTERM or SIGINT) after the first test batch."""

    def __init__(self, signal_name: str):
        self.signal = getattr(signal, signal_name)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0:
            os.kill(os.getpid(), self.signal)
