"""The record of a run: one line printed, and results.json in the run's folder."""

import json
from pathlib import Path

from lit_cli.errors import UsageError
from lit_cli.runs import log_dir
from lit_cli.signals import raise_if_asked
from lit_common.files import written_whole
from lit_models import TrainingSpeed
from lit_models.tags import class_metrics

SPLITS = {"test": "test", "validate": "val"}


def record(cli, stage: str, metrics: dict, checkpoint: str | None, extra: dict) -> dict:
    """The record of a fit and its test, or of a test or validation of a checkpoint: printed in
    one line, and written as results.json in its log folder (NaN written as null)."""
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    split = SPLITS.get(stage, "test")
    # By the classes' exact names: a metric's tag holds a name made safe for TensorBoard.
    named = class_metrics(model.class_names, split)
    per_class = {name: metrics[key] for key, name in named.items() if key in metrics}
    entry = {
        "stage": stage, "model": model.net_name,
        "data": getattr(data, "name", "") or type(data).__name__,
        f"{split}/acc": metrics.get(f"{split}/acc"), f"{split}/loss": metrics.get(f"{split}/loss"),
        "val/acc_best": metrics.get("val/acc_best"),
        "epochs": trainer.current_epoch, "global_step": trainer.global_step, **extra,
        "device": str(trainer.strategy.root_device), "precision": str(trainer.precision),
        "seed": cli.given.seed_everything, "checkpoint": checkpoint,
        "log_dir": log_dir(trainer),
        f"{split}/acc_per_class": per_class or None,
    }
    if trainer.is_global_zero:
        trainer.wrote = write(entry)
        print(summary(entry, split, stage, checkpoint), flush=True)
    return entry


def metrics(trainer, model, stage: str) -> dict:
    """What the test or validation just run logged, with the run's best val/acc."""
    raise_if_asked(trainer)  # at the last batch Lightning's loop ends quietly
    split = SPLITS[stage]
    batches = {"test": trainer.num_test_batches, "val": trainer.num_val_batches}[split]
    if not sum(batches):
        names = {"test": ("test", "validate"), "val": ("validation", "test")}[split]
        raise UsageError(f"there is no {names[0]} set to {stage} on (--data.val_size 0?): "
                         f"{names[1]} instead")
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(split)}
    best = None
    if model.val_acc_best.update_count:
        best = float(model.val_acc_best.compute())
    return logged | {"val/acc_best": best}


def of_the_fit(trainer, seconds: float, epochs: int, step: int) -> dict:
    """What a fit adds to its record: its time, its training speed, its epochs and steps."""
    speed = next((c for c in trainer.callbacks if isinstance(c, TrainingSpeed)), TrainingSpeed())
    return {"fit_seconds": round(seconds, 2),
            "train_images_per_second": round(speed.images_per_second, 1),
            "train_epoch_seconds": [round(s, 4) for s in speed.epoch_seconds],
            "epochs": epochs, "global_step": step}


def write(entry: dict) -> Path | None:
    """results.json in the entry's log folder, written whole; its path (none without a folder)."""
    if not entry["log_dir"]:
        return None
    finite = json.loads(json.dumps(entry), parse_constant=lambda nan: None)  # valid JSON
    # Names as given (classes, the run's folder), not as \u escapes.
    text = json.dumps(finite, indent=2, ensure_ascii=False)
    path = Path(entry["log_dir"], "results.json")
    with written_whole(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")
    return path


def summary(entry: dict, split: str, stage: str, checkpoint: str | None) -> str:
    """`mlp on mnist: test/acc 0.9712 (best val/acc 0.9730) after 30 epochs, ...`"""
    shown = number(entry[f"{split}/acc"], "not logged (--trainer.barebones)")
    source = f"from {checkpoint}"
    if stage == "fit":
        validation = number(entry["val/acc_best"], "", "best val/acc ") or "no validation"
        took = f"after {entry['epochs']} epochs, fit in {entry['fit_seconds']:.1f} s"
        source = f"({validation}) {took}"
    logs = "no logger"
    if entry["log_dir"]:
        logs = f"logs in {entry['log_dir']}"
    where = f"on {entry['device']}; {logs}"
    return f"{entry['model']} on {entry['data']}: {split}/acc {shown} {source} {where}"


def number(value: float | None, missing: str, name: str = "") -> str:
    """`name` and a metric to four places, or what to say when it was not measured."""
    if value is None:
        return missing
    return f"{name}{value:.4f}"
