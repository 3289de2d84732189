"""train.py's defaults: the default callbacks, which step aside for the Trainer flag that turns
their kind off; checkpoints written whole; the fast paths of a GPU.

The callbacks are the Trainer's `callbacks` default, so `--print_config` and config.yaml list them
and `--trainer.callbacks+=X` adds to them; a recipe or config that gives `callbacks` replaces them.
"""

import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.plugins import TorchCheckpointIO

from datamodules.files import WholeCheckpointIO
from lit_models import ImageClassifier
from lit_models.networks import import_class

BEST_CHECKPOINT = {
    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
    "init_args": {"monitor": "val/acc", "mode": "max", "auto_insert_metric_name": False,
                  "filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}"},
}
CALLBACKS = [
    BEST_CHECKPOINT,
    {"class_path": "lit_models.LastCheckpoint"},
    {"class_path": "lit_models.TrainingSpeed"},
    # Redrawn every 10 batches: at every batch, the bar is a measurable share of a small step.
    {"class_path": "lightning.pytorch.callbacks.TQDMProgressBar",
     "init_args": {"refresh_rate": 10}},
    {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor",
     "init_args": {"logging_interval": "step"}},
    {"class_path": "lit_models.Dashboards"},
]


def step_aside(trainer: Namespace, model: Namespace) -> list:
    """The Trainer configuration's callbacks less the defaults that its flags turn off (Lightning
    refuses a checkpoint beside `enable_checkpointing false`, a progress bar beside
    `enable_progress_bar false`, a learning-rate monitor without a logger), and less the best
    checkpoint by val/acc for a model that is not ImageClassifier, which may log no val/acc. A
    progress bar or a ModelCheckpoint of the user's takes the place of the default one, as
    Lightning's own defaults step aside for them."""
    bare = bool(trainer.get("barebones"))
    parsed = [(c, import_class(c.class_path), is_ours(c)) for c in trainer.callbacks or []]
    theirs = {kind for _, cls, ours in parsed for kind in (ProgressBar, ModelCheckpoint)
              if issubclass(cls, kind) and not ours}
    off = {ModelCheckpoint: trainer.enable_checkpointing is False or bare,
           ProgressBar: trainer.enable_progress_bar is False or bare or ProgressBar in theirs,
           LearningRateMonitor: trainer.logger is False or bare}
    own_model = issubclass(import_class(model.class_path), ImageClassifier)
    best_aside = ModelCheckpoint in theirs or not own_model
    kept = []
    for callback, cls, ours in parsed:
        turned_off = ours and any(issubclass(cls, kind) and is_off for kind, is_off in off.items())
        if not (turned_off or best_aside and is_default(callback, BEST_CHECKPOINT)):
            kept.append(callback)
    return kept


def is_ours(callback: Namespace) -> bool:
    """Whether a parsed callback is one of the defaults, as it comes."""
    return any(is_default(callback, spec) for spec in CALLBACKS)


def is_default(callback: Namespace, spec: dict) -> bool:
    """Whether a parsed callback is the default `spec` as it comes (with settings of the user's, it
    is theirs)."""
    given = callback.get("init_args") or Namespace()
    same = all(given.get(key) == value for key, value in spec.get("init_args", {}).items())
    return callback.class_path == spec["class_path"] and same


def on_the_trainer(trainer) -> None:
    """Checkpoints written whole (WholeCheckpointIO), where no plugin of the user's writes them."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = WholeCheckpointIO()


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
