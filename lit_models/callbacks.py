"""Callbacks of the recipes: the latest checkpoint (also where a signal stops a fit), the run's
record, the training speed, EMA. The same from Python as from train.py."""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.optim.swa_utils import get_ema_multi_avg_fn

from datamodules.files import written_whole
from lit_models.classifier import ImageClassifier
from lit_models.tags import class_metrics


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt`: the end of the latest epoch, or where SIGTERM or Ctrl-C stopped a fit, at a
    step's end or in a validation, where the state is whole: `--ckpt_path last` goes on from there.

    The one place where a fit's signals are handled. SIGTERM (pre-emption, `scancel`) is
    Lightning's: its loops stop at the step's end. The first Ctrl-C is a SIGTERM, the second
    Lightning's KeyboardInterrupt (at once, nothing saved). With several processes, a signal that
    reaches some of them (a node's torchrun passes it to its own only) is noted, and the processes
    agree at each step's end to stop together: Lightning's handler, run where the signal lands,
    broadcasts mid-step and hangs them (docs/multi-node.md). Other exceptions save nothing
    (ModelCheckpoint's `save_on_exception` would save a diverged model over a good one).

    Args:
        filename: the checkpoint's name, without `.ckpt`.
        every_n_train_steps: also save every N optimizer steps (0: at epoch ends only).
    """

    def __init__(self, filename: str = "last", every_n_train_steps: int = 0):
        super().__init__(filename=filename, monitor=None, enable_version_counter=False,
                         every_n_train_steps=every_n_train_steps or None)
        self.stopped_by: str | None = None  # "Ctrl-C" once Ctrl-C stopped a stage (else SIGTERM)
        self.saved_on_stop: str | None = None
        self.handlers: dict = {}

    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self.stopped_by, self.saved_on_stop, self.noted = None, None, False
        if threading.current_thread() is not threading.main_thread():
            return  # Python's handlers run in the main thread alone
        self.lightning_sigterm = signal.getsignal(signal.SIGTERM)
        self.handlers = {signal.SIGINT: signal.signal(signal.SIGINT, self.on_ctrl_c)}
        if trainer.world_size > 1:
            self.handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, self.note_sigterm)

    def on_ctrl_c(self, signum, frame):
        if self.stopped_by == "Ctrl-C":
            raise KeyboardInterrupt
        self.stopped_by = "Ctrl-C"
        print("\nStopping after this step (Ctrl-C again to stop at once) ...", file=sys.stderr,
              flush=True)
        signal.raise_signal(signal.SIGTERM)

    def note_sigterm(self, signum, frame):
        self.noted = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if signal.SIGTERM not in self.handlers:
            return
        if trainer.strategy.reduce_boolean_decision(self.noted, all=False):
            # Lightning's handler on every process at once: Lightning stops after this step.
            self.lightning_sigterm(signal.SIGTERM, None)

    def teardown(self, trainer, pl_module, stage):
        while self.handlers:
            signal.signal(*self.handlers.popitem())
        # Lightning's loops stop at a SIGTERM only before their last batch: one after it (the last
        # step, a test's last batch) stops the command here, not as a success.
        if trainer.received_sigterm and not trainer.interrupted:
            raise SIGTERMException

    def on_exception(self, trainer, pl_module, exception):
        # In validation too: Lightning resumes a fit in the middle of its validation as well.
        # Before its first step a fit has nothing to go on from.
        self.teardown(trainer, pl_module, "fit")
        if isinstance(exception, KeyboardInterrupt):  # Lightning ends it with exit(1): say why
            self.stopped_by = "Ctrl-C"
        fitting = trainer.state.fn == "fit" and not trainer.sanity_checking
        if isinstance(exception, SIGTERMException) and fitting and trainer.global_step > 0:
            self.saved_on_stop = self.format_checkpoint_name({})
            trainer.save_checkpoint(self.saved_on_stop, weights_only=False)


def run_folder(trainer) -> str | None:
    """The run's own folder, where a logger made one: TensorBoard's and CSV's `log_dir`; for a
    logger that keeps its runs elsewhere (MLflow, Weights & Biases), `save_dir/name/version`, where
    Lightning puts the run's checkpoints. Lightning's `trainer.log_dir` is such a logger's
    save_dir, which every run would share. The first process's (the loggers write there)."""
    if not trainer.loggers or trainer.fast_dev_run:  # Lightning's DummyLogger: no run folder
        return None
    logger = trainer.loggers[0]
    if isinstance(logger, (TensorBoardLogger, CSVLogger)):
        return logger.log_dir
    save_dir = logger.save_dir or trainer.default_root_dir
    return str(Path(save_dir, str(logger.name), str(logger.version)).absolute())


class RunRecord(L.Callback):
    """results.json in the run's folder: what ran (the model's class, its network, the data, the
    device, the seed) and what the module logged, under its own names, once a stage that started
    ends, however it ends (finished, stopped, failed). A stage of a run that has a record adds to
    it: a fit's test, a resumed fit. `record` is the last one written."""

    def __init__(self):
        self.record: dict | None = None
        self.started, self.clock = False, 0.0

    def setup(self, trainer, pl_module, stage):
        self.started, self.clock = False, time.perf_counter()

    def on_train_start(self, trainer, pl_module):
        self.started = True

    def on_validation_start(self, trainer, pl_module):
        self.started = self.started or not trainer.sanity_checking

    on_test_start = on_train_start

    def on_fit_end(self, trainer, pl_module):
        self.write(trainer, pl_module, "finished")

    on_test_end = on_fit_end

    def on_validation_end(self, trainer, pl_module):
        if trainer.state.fn == "validate":
            self.write(trainer, pl_module, "finished")

    def on_exception(self, trainer, pl_module, exception):
        if self.started:
            stops = [c.stopped_by for c in trainer.callbacks if isinstance(c, LastCheckpoint)]
            self.write(trainer, pl_module, status(exception, next(filter(None, stops), None)))

    @staticmethod
    def summary(record: dict) -> str:
        """A record in a line, `ImageClassifier(mlp) on mnist: test/acc 0.9712, val/acc_best 0.9730
        after 3 epochs (fit in 12.3 s) on cpu; logs in lightning_logs/version_0`: the accuracies
        the module logged, under its names (its losses where it logged no accuracy)."""
        metrics = {k: v for k, v in sorted(record["metrics"].items())
                   if k.startswith(("test", "val"))}
        shown = [k for k in metrics if "acc" in k and "class" not in k]
        shown = shown or [k for k in metrics if "loss" in k]
        said = ", ".join(f"{k} {metrics[k]:.4f}" for k in shown if metrics[k] is not None)
        model = record["model"] + (f"({record['network']})" if record["network"] else "")
        source = f"of {record.get('tested')}"
        if record["stage"] == "fit":
            source = f"after {record['epochs']} epochs (fit in {record['fit_seconds']:.1f} s)"
        return (f"{model} on {record['data']}: {said or 'no metrics logged'} {source} on "
                f"{record['device']}; logs in {record['log_dir']}")

    def write(self, trainer, pl_module, said: str) -> None:
        folder = trainer.is_global_zero and run_folder(trainer)  # the first process's
        if not folder:
            return
        path = Path(folder, "results.json")
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"metrics": {}}
        stage = trainer.state.fn.value
        if stage != "fit":
            record["tested"] = trainer.ckpt_path or "the weights as trained"
        if record.get("stage") == "fit":  # a fit's test, or a later one logged in its folder
            stage = "fit"
        data = trainer.datamodule
        logged = {k: v.item() for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        record.update({
            "model": type(pl_module).__name__, "network": getattr(pl_module, "net_name", None),
            "data": getattr(data, "name", None) or type(data).__name__, "stage": stage,
            "status": said, "seed": int(os.environ.get("PL_GLOBAL_SEED", -1)), "log_dir": folder,
            "device": str(trainer.strategy.root_device), "precision": str(trainer.precision),
            "metrics": {**record["metrics"], **logged}})
        # A fit's counts, which its test keeps (a BatchSizeFinder's trials at test reset them).
        if trainer.state.fn == "fit" or "epochs" not in record:
            record.update(epochs=trainer.current_epoch, global_step=trainer.global_step)
        if trainer.state.fn == "fit":
            record["ckpt_path"] = trainer.ckpt_path  # where it went on from
            record["fit_seconds"] = round(time.perf_counter() - self.clock, 2)
            best = [c.best_model_path for c in trainer.checkpoint_callbacks if c.monitor]
            record["best_model_path"] = (best or [None])[0] or None
        record.update(extras(pl_module, record["metrics"]))
        # NaN as null: valid JSON; names as given, not as \u escapes.
        text = json.dumps(json.loads(json.dumps(record), parse_constant=lambda nan: None),
                          indent=2, ensure_ascii=False)
        with written_whole(path) as tmp:
            tmp.write_text(text + "\n", encoding="utf-8")
        self.record = record


def status(exception: BaseException, stopped_by: str | None = None) -> str:
    """How a stage that raised `exception` ended, in a few words (`stopped_by`: the signal that
    LastCheckpoint heard)."""
    if isinstance(exception, SIGTERMException):
        return f"stopped by {stopped_by or 'SIGTERM'}"
    if isinstance(exception, KeyboardInterrupt):
        return "stopped by Ctrl-C"
    line = (str(exception).strip().splitlines() or [""])[0]
    return f"failed: {type(exception).__name__}: {line}"


def extras(pl_module, metrics: dict) -> dict:
    """What ImageClassifier adds to its record: its per-class accuracies by the classes' exact
    names (the metrics' tags are names made safe), and how a resumed fit went on."""
    if not isinstance(pl_module, ImageClassifier):
        return {}
    named = class_metrics(pl_module.class_names, "test")
    per_class = {name: metrics[tag] for tag, name in named.items() if tag in metrics}
    resumed = pl_module.resumed.said() if pl_module.resumed is not None else None
    return {"test/acc_per_class": per_class or None, "resumed": resumed}


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
        self._seconds, self._images, self._start = 0.0, 0, None

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
        # A shape, not a value: no wait for the device.
        self._images += extract_batch_size(batch)

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
            pl_module.log_dict({"train/epoch_seconds": self._seconds,
                                "train/images_per_second": images / self._seconds})


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
