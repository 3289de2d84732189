"""Train, checkpoint and test an image classifier with the Lightning CLI; fit, then test the best checkpoint.

    python train.py --model cnn                      # the tutorial CNN on CIFAR-10 (configs/cnn.yaml)
    python train.py --model mlp                      # the tutorial MLP on MNIST (configs/mlp.yaml)
    python train.py --model mlp --data fashion_mnist --trainer.max_epochs 5 --data.batch_size 256
    python train.py --config configs/seed_cnn.yaml   # the tutorial's exact settings
    python train.py --model cnn --print_config > my.yaml && python train.py --config my.yaml

`--model NAME` is shorthand for `--config configs/NAME.yaml` (the recipe: model, its data set, epochs),
applied before every other argument; `--data NAME` picks a data module by short name. Full class paths
work for both. Every run writes lightning_logs/version_N/ with TensorBoard events, checkpoints,
config.yaml and results.json.
"""

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

import torch
import yaml
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

import resume
from datamodules import DataSetupError, ImageDataModule
from lit_models import ImageClassifier
from lit_models.callbacks import LastCheckpoint, TrainingSpeed
from lit_models.classifier import NonFiniteLossError
from lit_models.dashboards import TensorBoardDashboards

# Lightning's progress bar redraws after every step by default, which costs the MLP 15% of its speed
# on a CPU; every 10th step looks the same to a reader.
os.environ.setdefault("TQDM_MINITERS", "10")

CONFIGS = Path(__file__).resolve().parent / "configs"
MODELS = {"cnn": CONFIGS / "cnn.yaml", "mlp": CONFIGS / "mlp.yaml"}
DATA = {
    "cifar10": "datamodules.CIFAR10DataModule",
    "mnist": "datamodules.MNISTDataModule",
    "fashion_mnist": "datamodules.FashionMNISTDataModule",
    "image_folder": "datamodules.ImageFolderDataModule",
}
CLASS_NAMES = {"model": {ImageClassifier.__name__}, "data": {p.rsplit(".", 1)[1] for p in DATA.values()}}


# jsonargparse would print every one of LightningCLI's ~150 options above each error.
USAGE = ("train.py [--model cnn|mlp] [--data NAME] [--config FILE] [--ckpt_path last|FILE] [options] "
         "(--help: all)")


class UsageError(Exception):
    """A command line that cannot run; reported like an argparse error (exit code 2)."""


def expand_short_names(argv: list[str]) -> list[str]:
    """Turn `--model NAME` into the recipe's `--config` (placed first) and `--data NAME` into a class path."""
    presets, rest, i = [], [], 0
    while i < len(argv):
        key, eq, value = argv[i].partition("=")
        if key not in ("--model", "--data") or (not eq and i + 1 >= len(argv)):
            rest.append(argv[i])
            i += 1
            continue
        if not eq:
            value = argv[i + 1]
        i += 1 if eq else 2
        group = key[2:]
        names = MODELS if group == "model" else DATA
        if value in names:
            if group == "model":
                presets += ["--config", str(MODELS[value])]
            else:
                rest.append(f"--data={DATA[value]}")
        elif "." in value or value in CLASS_NAMES[group] or value.lstrip().startswith("{"):
            rest.append(f"{key}={value}")  # a class path, class name or inline dict: jsonargparse's job
        else:
            raise UsageError(f"unknown --{group} '{value}'; choose one of: {', '.join(names)} "
                             f"(or a full class path)")
    configs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    configs += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    for path in configs:
        check_config_file(Path(path))
    if not presets and not configs:
        presets = ["--config", str(MODELS["cnn"])]  # the default recipe
    return presets + rest


def check_config_file(path: Path) -> None:
    """A missing or malformed --config file, named, before jsonargparse reports it without the name."""
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist")
    try:
        yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UsageError(f"config file {path} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None


class TrainCLI(LightningCLI):
    """LightningCLI wired for this project: data -> model links, checkpoints, resuming, precision by device."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for source, target in (("image_shape", "image_shape"), ("num_classes", "num_classes"),
                               ("classes", "class_names")):
            parser.link_arguments(f"data.{source}", f"model.init_args.{target}", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.monitor": "val/acc", "checkpoint.mode": "max",
            "checkpoint.filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}",
            "checkpoint.auto_insert_metric_name": False,
        })
        parser.add_argument("--tf32", type=bool, default=True,
                            help="TF32 matmuls and convolutions on NVIDIA GPUs (float32 precision='high')")
        parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                            help="Resume: 'last' (the newest run's checkpoints/last.ckpt) or a checkpoint file. "
                                 "A run's own checkpoint continues in that run's directory.")

    def before_instantiate_classes(self) -> None:
        trainer = self.config["trainer"]
        if trainer.get("precision") is None:
            # bf16 autocast where the GPU has bf16 units; on a CPU it is slower than float32.
            on_gpu = torch.cuda.is_available() and trainer.get("accelerator") in ("auto", "gpu", "cuda")
            trainer["precision"] = "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"
        if torch.cuda.is_available() and self.config["tf32"]:
            # TF32 for what stays in float32; on the CPU this setting would change the matmul kernels.
            torch.set_float32_matmul_precision("high")
            torch.backends.cudnn.allow_tf32 = True
        logger = trainer.get("logger")
        tensorboard = logger if getattr(logger, "class_path", "").endswith("TensorBoardLogger") else None
        if tensorboard is not None:
            # Absolute, so that checkpoints record where they are, and a run resumed from another
            # directory still finds its best checkpoint.
            tensorboard.init_args.save_dir = str(Path(tensorboard.init_args.save_dir).resolve())
        self.resume_checkpoint = resume.load_checkpoint(self.config["ckpt_path"], tensorboard)
        if tensorboard is not None:
            run_dir = resume.choose_run_dir(tensorboard.init_args, self.resume_checkpoint)
            if run_dir is not None:  # continuing a run: keep its config.yaml, add this one beside it
                config_name = resume.free_name(run_dir, "config.resume{}.yaml")
                self.save_config_kwargs["config_filename"] = config_name
            if os.environ.get("SLURM_JOB_ID"):  # Lightning's hpc_ckpt_*.ckpt go here, one job's only
                args = tensorboard.init_args
                trainer["default_root_dir"] = str(resume.logs_root(args) / args.version)
        if not logger:  # these need a logger
            self.trainer_defaults["callbacks"] = [cb for cb in self.trainer_defaults["callbacks"]
                                                  if not isinstance(cb, (LearningRateMonitor, TensorBoardDashboards))]

    def after_instantiate_classes(self) -> None:
        if self.resume_checkpoint is not None:
            resume.check_compatible(self.resume_checkpoint, self.model)


def trainer_defaults() -> dict:
    """Trainer defaults; a function because the callbacks must be new objects for every run."""
    return {
        "max_epochs": 30,
        "benchmark": True,  # cudnn autotuning: input shapes never change
        "logger": {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": ".", "name": "lightning_logs", "default_hp_metric": False,
                          "log_graph": True},
        },
        "callbacks": [LastCheckpoint(), TrainingSpeed(), LearningRateMonitor(), TensorBoardDashboards()],
    }


def device_name(trainer) -> str:
    device = trainer.strategy.root_device
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


class Stopped(Exception):
    """Training was stopped by a signal; the message says where, and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def fit(trainer, model, data, checkpoint) -> None:
    """trainer.fit, turning Ctrl-C and SIGTERM into a Stopped that names the checkpoint written."""
    try:
        trainer.fit(model, datamodule=data, ckpt_path=checkpoint.path if checkpoint else None, weights_only=True)
    except SystemExit as e:  # Lightning exits after Ctrl-C; SIGTERMException is a SystemExit too
        signal_name, code = ("SIGTERM", 143) if isinstance(e, SIGTERMException) else ("Ctrl-C", 130)
        if not trainer.interrupted:
            raise
        saved = next((cb.interrupted_path for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)), None)
        where = f"; saved {saved}" if saved else "; its last epoch will run again"
        raise Stopped(f"stopped by {signal_name} in epoch {trainer.current_epoch} at step "
                      f"{trainer.global_step}{where}. Add --ckpt_path last to the same command to go on.",
                      code) from None


def run(argv: list[str]) -> dict:
    # We hand LightningCLI the expanded sys.argv; it warns about getting both.
    warnings.filterwarnings("ignore", "LightningCLI's args parameter is intended")
    # TensorBoard's graph is traced with torch.jit.trace, which torch now calls deprecated, every run.
    warnings.filterwarnings("ignore", r"`torch\.jit\.trace(_method)?` is deprecated", FutureWarning)
    cli = TrainCLI(ImageClassifier, ImageDataModule, subclass_mode_model=True, subclass_mode_data=True,
                   trainer_defaults=trainer_defaults(), seed_everything_default=0, run=False,
                   save_config_kwargs={"overwrite": False},
                   parser_kwargs={"usage": USAGE, "description": __doc__.split("\n")[0]},
                   args=expand_short_names(argv))
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    effective_batch = data.effective_batch_size(trainer)
    if effective_batch != data.batch_size and trainer.is_global_zero:
        print(f"{trainer.world_size} processes x {trainer.accumulate_grad_batches} accumulated x batch "
              f"{data.batch_size} = effective batch {effective_batch}; the learning rate is not scaled "
              f"with it (set --model.lr for that)")
    start = time.perf_counter()
    fit(trainer, model, data, cli.resume_checkpoint)
    fit_seconds = time.perf_counter() - start
    speed = next(cb for cb in trainer.callbacks if isinstance(cb, TrainingSpeed))
    best = next((cb.best_model_path for cb in trainer.checkpoint_callbacks if cb.monitor), "")
    (test_metrics,) = trainer.test(model, datamodule=data, ckpt_path=best or None, verbose=False,
                                   weights_only=True)
    results = {
        "model": model.hparams.arch,
        "data": data.name,
        "epochs": trainer.current_epoch,
        "fit_seconds": round(fit_seconds, 2),
        "test/acc": test_metrics["test/acc"],
        "test/loss": test_metrics["test/loss"],
        "test_samples": int(test_metrics["test/samples"]),
        "val/acc_best": float(model.val_acc_best.compute()),
        "train_seconds": round(speed.train_seconds, 2),
        "train_images_per_second": round(speed.images_per_second, 1),
        "train_epoch_seconds": [round(t, 4) for t in speed.epoch_seconds],
        "test/acc_per_class": model.test_per_class_acc,
        "batch_size": data.batch_size,
        "effective_batch_size": effective_batch,
        "lr": float(trainer.optimizers[0].defaults["lr"]),
        "lr_scaling": "none",
        "world_size": trainer.world_size,
        "device": device_name(trainer),
        "precision": trainer.precision,
        "channels_last": model.uses_channels_last,
        "tf32": trainer.strategy.root_device.type == "cuda" and cli.config["tf32"],
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "compile": model.hparams.compile,
        "seed": cli.config["seed_everything"],
        "resumed_from": str(cli.resume_checkpoint.path) if cli.resume_checkpoint else None,
        "checkpoint": best,
        "log_dir": trainer.log_dir,
    }
    if trainer.is_global_zero:
        Path(results["log_dir"], "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print_summary(results)
    return results


def print_summary(results: dict) -> None:
    width = max(len(name) for name in results["test/acc_per_class"])
    for name, acc in results["test/acc_per_class"].items():
        print(f"Accuracy for class: {name:{width}s} is {100 * acc:.1f} %")
    print(f"{results['model']} on {results['data']}: test/acc {results['test/acc']:.4f} on "
          f"{results['test_samples']} images (best val/acc {results['val/acc_best']:.4f}), "
          f"{results['epochs']} epochs in {results['fit_seconds']:.1f} s on {results['device']} "
          f"({results['precision']}); logs in {results['log_dir']}")


def release_process_group() -> None:
    """Destroy the DDP process group before the interpreter exits.

    Lightning leaves it alive, and gloo's worker threads then die during interpreter teardown: one run in
    ten or so aborted with "terminate called without an active exception" (SIGABRT) after it had finished.
    Only called where every rank got to the same point: destroying it mid-collective can hang.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# What a user can fix gets one line and an exit code, no traceback (--verbose shows it anyway).
USER_ERRORS = (DataSetupError, resume.ResumeError, NonFiniteLossError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    try:
        run(argv)
        release_process_group()
    except UsageError as e:
        print(f"usage: {USAGE}\ntrain.py: error: {e}", file=sys.stderr)
        return 2
    except Stopped as e:
        if e.exit_code == 143:  # Lightning agrees on a SIGTERM stop across ranks; Ctrl-C can land mid-collective
            release_process_group()
        print(f"train.py: {e}", file=sys.stderr)
        return e.exit_code
    except (*USER_ERRORS, torch.cuda.OutOfMemoryError) as e:
        if verbose:
            raise
        message = str(e)
        if isinstance(e, torch.cuda.OutOfMemoryError):
            message = (f"the GPU ran out of memory ({message.splitlines()[0]}). Try a smaller "
                       f"--data.batch_size, or --data.on_device false to keep the data set in host memory.")
        print(f"train.py: error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
