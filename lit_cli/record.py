"""The record of a run: one line printed, and results.json in the run's folder."""

import json
from pathlib import Path

from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden

from lit_cli.errors import UsageError, explain
from lit_cli.runs import log_dir
from lit_cli.signals import raise_if_asked
from lit_common.files import written_whole
from lit_models import ImageClassifier, TrainingSpeed
from lit_models.dashboards import model_name
from lit_models.tags import class_metrics

SPLITS = {"test": "test", "validate": "val"}


def record(cli, stage: str, metrics: dict, checkpoint: str | None, extra: dict) -> dict:
    """The record of a fit and its test, or of a test or validation of a checkpoint, naming the
    model's class, its network (ImageClassifier's) and the data: printed in one line, and written
    as results.json in its log folder (NaN written as null)."""
    trainer, model = cli.trainer, cli.model
    split = SPLITS.get(stage, "test")
    per_class = None
    if isinstance(model, ImageClassifier):  # by the classes' exact names, not their tags'
        named = class_metrics(model.class_names, split)
        per_class = {name: metrics[key] for key, name in named.items() if key in metrics}
    network = None
    if isinstance(model, ImageClassifier):
        network = model.net_name
    entry = {
        "stage": stage, "model": type(model).__name__, "network": network,
        "data": getattr(cli.datamodule, "name", "") or type(cli.datamodule).__name__,
        f"{split}/acc": metrics.get(f"{split}/acc"), f"{split}/loss": metrics.get(f"{split}/loss"),
        "val/acc_best": metrics.get("val/acc_best"), "test": metrics.get("test"),
        "epochs": trainer.current_epoch, "global_step": trainer.global_step, **extra,
        "device": str(trainer.strategy.root_device), "precision": str(trainer.precision),
        "seed": cli.given.seed_everything, "checkpoint": checkpoint,
        "log_dir": log_dir(trainer),
        f"{split}/acc_per_class": per_class or None,
    }
    if stage != "fit":
        del entry["test"]
    if trainer.is_global_zero:
        trainer.wrote = write(entry)
        print(f"{model_name(model)} {summary(entry, split, stage, checkpoint)}", flush=True)
    return entry


def test_after_fit(cli) -> dict:
    """The test of a fit's best checkpoint (its last weights without one), where the model has a
    test_step and the data a test split: what it logged, or why it was skipped."""
    trainer, model = cli.trainer, cli.model
    untested = untestable(model, cli.datamodule)
    if untested:
        return {"test": f"skipped: {untested}"}
    # Its hyperparameters logged again would reset TensorBoard's hp_metric to -1.
    trainer.enable_autolog_hparams = False
    quiet = cli.given.trainer.enable_progress_bar is False  # no table of metrics either
    cli.stops.hold()
    trainer.test(model, datamodule=cli.datamodule, ckpt_path=cli.best, weights_only=True,
                 verbose=not quiet)
    cli.stops.release()
    return metrics(trainer, model, "test", after_fit=True)


def metrics(trainer, model, stage: str, after_fit: bool = False) -> dict:
    """What the test or validation just run logged, with the run's best val/acc where the model
    keeps it (ImageClassifier). No batches: a UsageError, or after a fit a skipped test."""
    raise_if_asked(trainer)  # at the last batch Lightning's loop ends quietly
    split = SPLITS[stage]
    batches = {"test": trainer.num_test_batches, "val": trainer.num_val_batches}[split]
    if not sum(batches) and after_fit:
        return {"test": "skipped: no test batches (--trainer.limit_test_batches 0?)"}
    if not sum(batches):
        names = {"test": ("test", "validate"), "val": ("validation", "test")}[split]
        raise UsageError(f"there is no {names[0]} set to {stage} on (--data.val_size 0?): "
                         f"{names[1]} instead")
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(split)}
    best = None
    if isinstance(model, ImageClassifier) and model.val_acc_best.update_count:
        best = float(model.val_acc_best.compute())
    return logged | {"val/acc_best": best, "test": "tested"}


def untestable(model, data) -> str | None:
    """Why a fit's model cannot be tested after it: no test_step, or no test split."""
    if not is_overridden("test_step", model):
        return f"{type(model).__name__} has no test_step"
    if data is None or not is_overridden("test_dataloader", data):
        return "the data module has no test_dataloader"
    return None


def failure(error: BaseException) -> str:
    """What a test after a fit that did not end says of it in the fit's record."""
    if isinstance(error, (SIGTERMException, KeyboardInterrupt)):
        return "stopped"
    said = explain(error)[1] or f"{type(error).__name__}: {error}"
    return f"failed: {said}"


def of_the_fit(trainer, seconds: float) -> dict:
    """What a fit adds to its record, read before its test: its time, how it went on from its
    checkpoint, its training speed, its epochs, steps and best val/acc."""
    speed = next((c for c in trainer.callbacks if isinstance(c, TrainingSpeed)), TrainingSpeed())
    best = trainer.callback_metrics.get("val/acc_best")
    model, resumed = trainer.lightning_module, None
    if isinstance(model, ImageClassifier) and model.resumed is not None:
        resumed = model.resumed.said()
    return {"fit_seconds": round(seconds, 2), "resumed": resumed,
            "train_images_per_second": round(speed.images_per_second, 1),
            "train_epoch_seconds": [round(s, 4) for s in speed.epoch_seconds],
            "epochs": trainer.current_epoch, "global_step": trainer.global_step,
            "val/acc_best": None if best is None else float(best)}


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
    """`on mnist: test/acc 0.9712 (best val/acc 0.9730) after 30 epochs, fit in ...`, after the
    model's name."""
    missing = "not logged"
    if entry["network"] is not None:  # ImageClassifier's: logged but under barebones
        missing = "not logged (--trainer.barebones)"
    shown = f"{split}/acc " + number(entry[f"{split}/acc"], missing)
    if entry.get("test") not in (None, "tested"):
        shown = f"test {entry['test']}"
    source = f"from {checkpoint}"
    if stage == "fit":
        validation = number(entry["val/acc_best"], "", "best val/acc ") or "no validation"
        took = f"after {entry['epochs']} epochs, fit in {entry['fit_seconds']:.1f} s"
        source = f"({validation}) {took}"
    logs = "no logger"
    if entry["log_dir"]:
        logs = f"logs in {entry['log_dir']}"
    where = f"on {entry['device']}; {logs}"
    return f"on {entry['data']}: {shown} {source} {where}"


def number(value: float | None, missing: str, label: str = "") -> str:
    """`label` and a metric to four places, or what to say when it was not measured."""
    if value is None:
        return missing
    return f"{label}{value:.4f}"
