"""What a run prints: one line per finished epoch, and no warnings a user cannot act on."""

import logging
import sys
import time
import warnings

from lightning.pytorch.callbacks import TQDMProgressBar


class EpochProgress(TQDMProgressBar):
    """Lightning's progress bar, counting optimizer steps, keeping one line per finished epoch on screen.

    Each epoch's bar stays, with that epoch's final train and validation metrics (a history, as Keras and
    airbench print it). When the output is not a terminal (CI, a log file, SLURM) there are no bars: one
    plain line per epoch, instead of a bar redrawn thousands of times into the file.
    """

    def __init__(self, plain: bool | None = None):
        super().__init__(leave=True)
        self.plain = not sys.stdout.isatty() if plain is None else plain
        if self.plain:
            self.disable()  # Lightning still makes its bars, disabled: they print nothing
        self._open = False  # an epoch whose bar (or line) is still to be finished
        self._epoch_start = 0.0

    def on_train_start(self, trainer, pl_module):
        pass  # Lightning's bar for the whole of training would stay on screen, empty: each epoch makes its own

    def on_train_epoch_start(self, trainer, *args):
        self._finish_epoch(trainer)  # the metrics of the epoch before are all logged by now
        self._open, self._epoch_start = True, time.perf_counter()
        self._epoch_number = trainer.current_epoch + 1
        super().on_train_epoch_start(trainer, *args)
        chunks = trainer.train_dataloader
        if hasattr(chunks, "num_steps"):  # count optimizer steps, not calls of several
            self.train_progress_bar.total = chunks.num_steps
            self.train_progress_bar.initial = chunks.yielded

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        chunks = trainer.train_dataloader
        if not hasattr(chunks, "yielded"):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        elif not self.is_disabled:
            self.train_progress_bar.n = chunks.yielded
            self.train_progress_bar.refresh()

    def on_train_epoch_end(self, trainer, pl_module):
        pass  # finished when the next epoch starts or training ends, once the epoch's metrics are all logged

    def on_train_end(self, trainer, pl_module):
        self._finish_epoch(trainer)
        super().on_train_end(trainer, pl_module)

    def get_metrics(self, trainer, pl_module) -> dict:
        return ordered(super().get_metrics(trainer, pl_module))

    def _finish_epoch(self, trainer) -> None:
        if not self._open:
            return
        self._open = False
        metrics = ordered(trainer.progress_bar_metrics)
        if not self.plain:
            self.train_progress_bar.set_postfix(metrics)
            self.train_progress_bar.close()
        elif trainer.is_global_zero:
            shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items())
            seconds = time.perf_counter() - self._epoch_start
            print(f"Epoch {self._epoch_number}/{trainer.max_epochs}: {shown} ({seconds:.1f} s)", flush=True)


ORDER = ("train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best")


def ordered(metrics: dict) -> dict:
    """Train before validation, loss before accuracy; without Lightning's `v_num` (the run's directory is printed
    when it starts)."""
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(((k, v) for k, v in metrics.items() if k != "v_num"), key=lambda kv: rank.get(kv[0], 99)))


class _DropTip(logging.Filter):
    def filter(self, record):
        return "litlogger" not in record.getMessage()


def quiet_warnings() -> None:
    """Silence the warnings that say nothing a user of this project can act on (each named, by message)."""
    # TensorBoard's graph is traced with torch.jit.trace, which torch now calls deprecated, every run.
    warnings.filterwarnings("ignore", r"`torch\.jit\.trace(_method)?` is deprecated", FutureWarning)
    # Our epoch metrics are reduced over the ranks before they are logged (ImageClassifier._log).
    warnings.filterwarnings("ignore", r".*when logging on epoch level in distributed setting")
    # Lightning's own pytree helper, on every run with this torch.
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # About Lightning's per-step logging, which we do not use: it counts calls of several steps.
    warnings.filterwarnings("ignore", r"The number of training batches \(\d+\) is smaller than the logging interval")
    # test/validate of a checkpoint: Lightning restores the training run's ModelCheckpoint state, of no use there.
    warnings.filterwarnings("ignore", r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint")
    warnings.filterwarnings("ignore", r"The dirpath has changed from")
    # A resumed run writes into its own checkpoints/ again, on purpose.
    warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")
    # We hand LightningCLI the expanded command line; it warns about getting both that and sys.argv.
    warnings.filterwarnings("ignore", "LightningCLI's args parameter is intended")
    # An advertisement for a cloud logger, printed by Lightning at every Trainer start.
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_DropTip())
