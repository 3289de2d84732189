"""The default callbacks, and when each steps aside for a flag or a callback of the user's; the
defaults on a GPU.

They are the Trainer's `callbacks` default, so `--print_config` and config.yaml list them and
`--trainer.callbacks+=X` adds to them; a recipe or config that gives `callbacks` replaces them.
"""

import inspect
from dataclasses import dataclass

import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins import TorchCheckpointIO
from lightning.pytorch.plugins.environments import SLURMEnvironment

from lit_common.files import WholeCheckpointIO
from lit_models import ImageClassifier, LastCheckpoint, TimedProgressBar
from lit_models.networks import import_class

BEST_CHECKPOINT = {
    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
    "init_args": {"monitor": "val/acc", "mode": "max", "auto_insert_metric_name": False,
                  "filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}"},
}
LEARNING_RATE = {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor",
                 "init_args": {"logging_interval": "step"}}
DASHBOARDS = {"class_path": "lit_models.Dashboards"}
PROGRESS_BAR = {"class_path": "lit_models.TimedProgressBar"}
DEFAULT_CALLBACKS = [
    BEST_CHECKPOINT,
    {"class_path": "lit_models.LastCheckpoint"},
    {"class_path": "lit_models.TrainingSpeed"},
    PROGRESS_BAR,
    LEARNING_RATE,
    DASHBOARDS,
]
# Testing, validating, predicting and exporting a checkpoint: what they show, not what trains.
USE_CALLBACKS = [DASHBOARDS, PROGRESS_BAR]


@dataclass
class Situation:
    """What the Trainer's flags and the user's own callbacks say, for the rules below."""

    no_checkpoints: bool
    no_progress_bar: bool
    no_logger: bool
    theirs: list[type]
    their_save_last: bool
    their_model: bool  # a LightningModule of the user's, which may log no val/acc

    def has(self, cls: type) -> bool:
        return any(issubclass(c, cls) for c in self.theirs)


# A default callback steps aside when its rule holds: Lightning's own rule for its default
# ModelCheckpoint and progress bar, applied to ours.
RULES = {
    ModelCheckpoint: lambda s: s.no_checkpoints or s.their_model or any(
        issubclass(c, ModelCheckpoint) and c is not LastCheckpoint for c in s.theirs),
    LastCheckpoint: lambda s: s.no_checkpoints or s.their_save_last,
    TimedProgressBar: lambda s: s.no_progress_bar or s.has(ProgressBar),
    LearningRateMonitor: lambda s: s.no_logger or s.has(LearningRateMonitor),
}


def without_those_that_step_aside(trainer: Namespace, model: Namespace) -> list:
    """The callbacks of a Trainer's configuration less the defaults whose rule holds, for the
    model `model` ({class_path, init_args})."""
    callbacks = list(trainer.callbacks or [])
    ours = [is_default(c) and c not in callbacks[:i] for i, c in enumerate(callbacks)]
    mine = [c for c, default in zip(callbacks, ours) if not default]
    bare = bool(trainer.get("barebones"))
    situation = Situation(
        no_checkpoints=trainer.enable_checkpointing is False or bare,
        no_progress_bar=trainer.enable_progress_bar is False or bare,
        no_logger=trainer.logger is False or bare,
        theirs=[import_class(c.class_path) for c in mine],
        their_save_last=any(saves_last(c) for c in mine),
        their_model=not issubclass(import_class(model.class_path), ImageClassifier),
    )
    kept = []
    for callback, default in zip(callbacks, ours):
        rule = RULES.get(import_class(callback.class_path), never)
        if not (default and rule(situation)):
            kept.append(callback)
    return kept


def never(situation: Situation) -> bool:
    """The rule of the defaults that always run: the training speed, the dashboards."""
    return False


def is_default(callback: Namespace) -> bool:
    """Whether a callback is a default as it comes: with settings of the user's it is theirs."""
    for spec in DEFAULT_CALLBACKS:
        if callback.class_path == spec["class_path"]:
            wanted = class_defaults(spec["class_path"]) | spec.get("init_args", {})
            given = (callback.get("init_args") or {}).items()
            return all(value == wanted.get(key) for key, value in given)
    return False


def saves_last(callback: Namespace) -> bool:
    is_checkpoint = issubclass(import_class(callback.class_path), ModelCheckpoint)
    return is_checkpoint and bool((callback.get("init_args") or {}).get("save_last"))


def class_defaults(class_path: str) -> dict:
    """The default values of a class's arguments."""
    parameters = inspect.signature(import_class(class_path)).parameters.items()
    return {name: p.default for name, p in parameters if p.default is not inspect.Parameter.empty}


def on_the_trainer(trainer, logger_given) -> None:
    """The project's defaults on a Trainer: checkpoints written whole (WholeCheckpointIO, where no
    plugin of the user's writes them), and Lightning's default logger (`logger_given` None or
    true) made again as Lightning makes it but without the -1 `hp_metric` it logs when a run
    starts: that point bends TensorBoard's smoothed curve of the real one (val/acc_best)."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = WholeCheckpointIO()
    if logger_given not in (None, True) or not isinstance(trainer.logger, TensorBoardLogger):
        return
    trainer.logger = TensorBoardLogger(save_dir=trainer.default_root_dir, default_hp_metric=False,
                                       version=SLURMEnvironment.job_id())


def on_gpus(trainer: Namespace) -> None:
    """The project's defaults where a run may use a GPU: TF32 for what stays in float32, bf16
    mixed precision where the GPU has it (on a CPU, 32-bit: bf16 autocast is slower), and
    cuDNN's autotuner as this session's setting. Not the Trainer's `benchmark`: Lightning's
    None keeps the session's setting and its `deterministic` turns it off, as for any user's."""
    on_gpu = trainer.accelerator in ("auto", "gpu", "cuda")
    if not (torch.cuda.is_available() and on_gpu):
        return
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.benchmark = True
    if trainer.precision is None and torch.cuda.is_bf16_supported():
        trainer.precision = "bf16-mixed"
