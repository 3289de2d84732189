"""What a run reports: results.json in its run directory, and the per-class table and summary it prints."""

import json
import math
from pathlib import Path

import torch

from cli.app import device_description, tf32_in_use


def run_results(stage: str, trainer, model, data, run, metrics: dict, fit_seconds: float | None,
                speed=None, checkpoint: str | None = None) -> dict:
    """The record of a run: what ran (model, data, optimizer, device, settings) and what it measured."""
    optimizer = trainer.optimizers[0] if trainer.optimizers else None
    results = {
        "stage": stage,
        "model": model.hparams.arch,
        "data": data.name,
        "test/acc": metrics.get("test/acc"),
        "test/loss": metrics.get("test/loss"),
        "test_samples": int(metrics["test/samples"]) if "test/samples" in metrics else None,
        "val/acc": metrics.get("val/acc"),
        "val/loss": metrics.get("val/loss"),
        "val/acc_best": finite_or_none(float(model.val_acc_best)),
        "test/acc_per_class": {name: finite_or_none(acc) for name, acc in
                               getattr(model, "test_per_class_acc", {}).items()} or None,
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "fit_seconds": round(fit_seconds, 2) if fit_seconds is not None else None,
        "optimizer": type(optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer).__name__
        if optimizer else None,
        "lr": optimizer.defaults["lr"] if optimizer else None,
        "scheduler": type(trainer.lr_scheduler_configs[0].scheduler).__name__
        if trainer.lr_scheduler_configs else None,
        "batch_size": data.batch_size,
        "effective_batch_size": data.effective_batch_size(trainer),
        "steps_per_call": data.steps_per_call_used,
        "lr_scaling": "none",
        "world_size": trainer.world_size,
        "device": device_description(trainer),
        "precision": trainer.precision,
        "channels_last": model.uses_channels_last,
        "tf32": tf32_in_use(trainer),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "compile": model.hparams.compile,
        "seed": run.config["seed_everything"],
        "resumed_from": str(run.resumed.path) if run.resumed else None,
        "checkpoint": checkpoint,
        "log_dir": str(run.dir) if run.dir else None,
    }
    if speed is not None:
        results.update({
            "train_seconds": round(speed.train_seconds, 2),
            "train_images_per_second": round(speed.images_per_second, 1),
            "train_epoch_seconds": [round(t, 4) for t in speed.epoch_seconds],
            "epochs_this_run": len(speed.epoch_seconds),
        })
    return {k: finite_or_none(v) if isinstance(v, float) else v for k, v in results.items()}


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN or infinity: a value that is neither (no validation, say) is recorded as null."""
    return value if math.isfinite(value) else None


def write(results: dict, run_dir: Path | None) -> None:
    if run_dir is not None:
        Path(run_dir, "results.json").write_text(json.dumps(results, indent=2) + "\n")


def print_summary(results: dict) -> None:
    per_class = results.get("test/acc_per_class")
    if per_class:
        width = max(len(name) for name in per_class)
        for name, acc in per_class.items():
            shown = "no test images" if acc is None or math.isnan(acc) else f"{100 * acc:.1f} %"
            print(f"Accuracy for class: {name:{width}s} is {shown}")
    stage = results["stage"]
    parts = [f"{results['model']} on {results['data']}:"]
    if results.get("test/acc") is not None:
        parts.append(f"test/acc {results['test/acc']:.4f} on {results['test_samples']} images")
    if results.get("val/acc") is not None and stage == "validate":
        parts.append(f"val/acc {results['val/acc']:.4f}")
    if stage == "fit":
        best = results.get("val/acc_best")
        parts.append(f"(best val/acc {best:.4f})," if best is not None else "(no validation),")
        epochs, this_run = results["epochs"], results.get("epochs_this_run", results["epochs"])
        trained = f"{epochs} epochs" if this_run == epochs else f"{this_run} of its {epochs} epochs"
        parts.append(f"{trained} in {results['fit_seconds']:.1f} s on {results['device']} ({results['precision']});")
    else:
        parts.append(f"from {results['checkpoint']};")
    parts.append(f"logs in {results['log_dir']}" if results.get("log_dir") else "nothing written (fast_dev_run)")
    print(" ".join(parts))
