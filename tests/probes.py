"""Callbacks that tests add to a run from the command line (`--trainer.callbacks+=...`)."""

import json
import os
import signal
from pathlib import Path

import lightning as L
import torch


class SigtermAtStep(L.Callback):
    """Send this process SIGTERM after global step `step`: what a scheduler's pre-emption does."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.is_global_zero:
            os.kill(os.getpid(), signal.SIGTERM)


class NanLossAtStep(L.Callback):
    """Poison the weights after global step `step`, so that the next loss is NaN."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
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
            "world_size": trainer.world_size, "weights": weights,
            "train_batches": trainer.num_training_batches}))


class InterruptAtStep(L.Callback):
    """Press Ctrl-C (SIGINT to this process) after global step `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)
