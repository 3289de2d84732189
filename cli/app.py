"""The LightningCLI of this project: what links the data to the model, where a run writes, and the Trainer
settings that follow from the device.

`build(stage, argv)` parses a command line (short names already expanded) and returns the model, the data
module and a Trainer whose run directory is claimed. Nothing is trained here.
"""

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_only

from cli import runs
from cli.args import USAGE
from cli.console import EpochProgress
from datamodules import ImageDataModule
from lit_models import ImageClassifier
from lit_models.callbacks import LastCheckpoint, LearningRateCurve, TrainingSpeed
from lit_models.dashboards import TensorBoardDashboards

MAX_SEED = 2**32 - 1  # what seed_everything (numpy's generator) accepts


class RunConfig(SaveConfigCallback):
    """Saves the configuration the user asked for into the run directory (config.yaml; a resumed run's
    beside it as config.resume1.yaml, ...), once training starts: a resume that finds nothing left to train,
    or fails on its checkpoint, leaves the run directory as it was."""

    def __init__(self, parser, config, run_dir: Path, filename: str):
        super().__init__(parser, config, config_filename=filename, overwrite=False, save_to_log_dir=False)
        self.run_dir = run_dir

    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            self._save(trainer)

    def on_train_start(self, trainer, pl_module):
        self._save(trainer)

    def _save(self, trainer):
        if trainer.is_global_zero and not self.already_saved:
            self.parser.save(self.config, self.run_dir / self.config_filename, skip_none=False, overwrite=False)
            self.already_saved = True

    def save_config(self, trainer, pl_module, stage):  # required by save_to_log_dir=False; _save does it
        pass


def trainer_defaults() -> dict:
    """Trainer defaults; a function because the callbacks must be new objects for every run."""
    return {
        "max_epochs": 30,
        "benchmark": True,  # cudnn autotuning: input shapes never change
        "logger": {
            "class_path": "lit_models.dashboards.TensorBoardLogger",
            # name None: the run's series, `<model>-<data>` (see runs.py)
            "init_args": {"save_dir": "lightning_logs", "name": None, "default_hp_metric": False, "log_graph": True},
        },
        "callbacks": [LastCheckpoint(), TrainingSpeed(), LearningRateCurve(), TensorBoardDashboards()],
    }


@dataclass
class Run:
    """What `build` decided beyond LightningCLI's objects: where the run writes and what it resumes."""

    dir: Path | None  # None for fast_dev_run, which writes nothing
    resumed: runs.Checkpoint | None
    config: Namespace
    existing: set[Path] = field(default_factory=set)  # a resumed run's files before it started


class TrainCLI(LightningCLI):
    """LightningCLI wired for this project: data -> model links, one run directory per run, device settings.

    `stage` is the subcommand it serves (fit, validate, test, predict, export); `checkpoint` the one a
    use command evaluates (its series names the run directory).
    """

    def __init__(self, argv: list[str], stage: str = "fit", checkpoint: runs.Checkpoint | None = None,
                 callbacks: tuple = (), parse_only: bool = False):
        self.stage, self.evaluated, self.extra_callbacks = stage, checkpoint, list(callbacks)
        self.parse_only = parse_only
        self.run = None
        super().__init__(ImageClassifier, ImageDataModule, subclass_mode_model=True, subclass_mode_data=True,
                         trainer_defaults=trainer_defaults(), seed_everything_default=0, run=False,
                         save_config_callback=None, auto_configure_optimizers=False,
                         parser_kwargs={"usage": USAGE, "description": "Train, test and use image classifiers.",
                                        "exit_on_error": False},
                         args=argv)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # What the network and its checkpoint need to know about the data, known once the data module is.
        for source, target in (("image_shape", "image_shape"), ("num_classes", "num_classes"),
                               ("classes", "class_names"), ("mean", "mean"), ("std", "std")):
            parser.link_arguments(f"data.{source}", f"model.init_args.{target}", apply_on="instantiate")
        # The seed reaches the data module's shuffling and augmentation by this link, not by the environment.
        parser.link_arguments("seed_everything", "data.init_args.seed", compute_fn=seed_value)
        # Lightning's automatic accumulation does not combine with the model's manual optimization: the model
        # accumulates, and the data module keeps whole accumulation groups within a call (see instantiate_trainer).
        parser.link_arguments("trainer.accumulate_grad_batches", "model.init_args.accumulate_grad_batches")
        parser.link_arguments("trainer.accumulate_grad_batches", "data.init_args.accumulate_grad_batches")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.monitor": "val/acc", "checkpoint.mode": "max",
            "checkpoint.filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}",
            "checkpoint.auto_insert_metric_name": False,
        })
        parser.add_argument("--tf32", type=bool, default=True,
                            help="TF32 for float32 matmuls and convolutions on NVIDIA GPUs (no effect on a CPU)")
        parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                            help="fit: resume 'last' (this model and data's newest run), a run directory or a "
                                 "checkpoint file; test/validate/predict/export: the checkpoint to use, or 'best'/"
                                 "'last' of the newest run, or a run directory (its best)")
        if self.stage == "predict":
            # nargs: `--inputs a.jpg photos/ 'scans/*.png'`, as a shell's glob expansion hands them over.
            parser.add_argument("--inputs", type=str, nargs="+", default=None,
                                help="image files, folders (searched recursively) or globs; none: the test split "
                                     "of the checkpoint's data set, with its true labels")
            parser.add_argument("--output", type=Optional[str], default=None,
                                help="the CSV file to write (replaced if it exists); default: a new "
                                     "predictions-<time>.csv in the checkpoint's run directory")
            parser.add_argument("--top_k", type=int, default=3, help="classes listed per image, most likely first")
        if self.stage == "export":
            parser.add_argument("--format", type=str, default="onnx", help="onnx, torchscript or pt2")
            parser.add_argument("--output", type=Optional[str], default=None,
                                help="the file to write (replaced if it exists); default: a new file in the "
                                     "checkpoint's run directory, named after the checkpoint")

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        seed = self.config["seed_everything"]
        if seed is True:
            # Chosen here, not by seed_everything, so that the data module's link gets the same seed.
            seed = random.randint(0, MAX_SEED)
            self.config["seed_everything"] = seed
            self.config["data"]["init_args"]["seed"] = seed
        elif seed is not False and not 0 <= seed <= MAX_SEED:
            raise SeedError(f"--seed_everything {seed}: a seed is an integer from 0 to {MAX_SEED}, or true/false")

    def _set_seed(self) -> None:
        if not self.parse_only:  # parsing alone seeds nothing (and says nothing about it)
            super()._set_seed()

    def before_instantiate_classes(self) -> None:
        if self.parse_only:
            raise Parsed(self)

    def instantiate_trainer(self, **kwargs):
        try:  # a bad optimizer or schedule argument is a command-line error, found before anything is written
            self.model.make_optimizer(total_steps=100)
        except (ValueError, TypeError) as e:
            raise OptimizerError(f"--model.optimizer / --model.scheduler: {e}") from None
        config = self._get(self.config_init, "trainer")
        user = self.config["trainer"]
        data = self.datamodule
        kwargs["accumulate_grad_batches"] = 1  # the model accumulates (linked above)
        if not config.get("plugins"):
            kwargs["plugins"] = [runs.NamedCheckpointIO()]
        if user.get("precision") is None:  # resolved here, not in the config: a replay on a GPU gets bf16
            # bf16 autocast where the GPU has bf16 units; on a CPU it is slower than float32.
            on_gpu = torch.cuda.is_available() and user.get("accelerator") in ("auto", "gpu", "cuda")
            kwargs["precision"] = "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"
        if torch.cuda.is_available():
            # TF32 for what stays in float32, both kinds of kernels; on a CPU these settings do nothing.
            tf32 = bool(self.config["tf32"])
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32

        checkpoint_callback = self._get(self.config_init, "checkpoint")
        # Without a validation set there is no best epoch: the last checkpoint is the one tested.
        extra = [checkpoint_callback] if data.has_validation and self.stage == "fit" else []
        extra += self.extra_callbacks
        if config.get("enable_progress_bar", True) is not False:
            extra.append(EpochProgress())
        run_dir, resumed = None, None
        if not config.get("fast_dev_run") and self.stage in ("fit", "test", "validate"):
            run_dir, resumed = self._run_directory(config, user)
            kwargs["default_root_dir"] = str(run_dir)  # Lightning's own files (SLURM's hpc_ckpt_*) go there too
            kwargs["logger"] = self._logger(config.get("logger"), run_dir)
            for callback in [*extra, *self.trainer_defaults["callbacks"], *(config.get("callbacks") or [])]:
                if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
                    callback.dirpath = str(run_dir / "checkpoints")
            config_name = "config.yaml" if not (run_dir / "config.yaml").exists() else \
                runs.free_name(run_dir, "config.resume{}.yaml")
            extra.append(RunConfig(self.parser, self.config, run_dir, config_name))
        if self.stage in ("predict", "export"):
            kwargs["logger"] = False  # using a model makes no run of its own
        self.run = Run(run_dir, resumed, self.config, set(run_dir.rglob("*")) if resumed and run_dir else set())
        try:
            return self._instantiate_trainer({**config, **kwargs}, extra)
        except Exception:
            runs.discard_if_unused(self.run)  # a Trainer argument Lightning refuses: leave no empty run behind
            raise

    def _run_directory(self, trainer_config: dict, user: Namespace) -> tuple[Path, runs.Checkpoint | None]:
        """Claim the run's directory (or take its checkpoint's, when resuming)."""
        logger_args = logger_init_args(user.get("logger"))
        save_dir = Path(logger_args.get("save_dir") or "lightning_logs")
        name = logger_args.get("name") or runs.run_name(self.model.hparams.arch, self.datamodule.name)
        root = (save_dir / name).resolve()  # absolute: checkpoints record where they are
        resumed = None
        if self.stage == "fit" and self.config["ckpt_path"]:
            resumed = runs.find_checkpoint(self.config["ckpt_path"], save_dir.resolve(), name, prefer="last")
            runs.check_compatible(resumed, self.model, self.datamodule.name)
            runs.check_unfinished(resumed, trainer_config.get("max_epochs"), trainer_config.get("max_steps", -1),
                                  resumed.run_dir)
            rank_zero_only(print)(f"Resuming {resumed.describe()}")
            if resumed.run_dir is not None:
                return resumed.run_dir, resumed
        if self.evaluated is not None and self.evaluated.run_dir is not None and not logger_args.get("name"):
            root = self.evaluated.run_dir.parent  # a test of a run goes into that run's series
        version = logger_args.get("version")
        slurm = runs.slurm_run_dir(root) if version is None else None
        if slurm is not None:
            if slurm.is_dir() or rank_zero_only.rank != 0:  # a requeued job: Lightning resumes its hpc_ckpt_*.ckpt
                return slurm, resumed
            version = slurm.name
        if rank_zero_only.rank != 0:  # rank 0 claims the directory; the others only need its name
            named = root / (version if isinstance(version, str) else f"version_{version}") if version is not None \
                else runs.newest_run_dir(root)
            return named or root / "version_0", resumed
        return runs.claim_run_dir(root, version), resumed

    def _logger(self, logger, run_dir: Path):
        """The configured logger, writing into the run directory (TensorBoard's and CSV's numbering is ours)."""
        if not logger or isinstance(logger, bool) or not hasattr(logger, "save_dir"):
            return logger
        args = logger_init_args(self.config["trainer"].get("logger"))
        args.update(save_dir=str(run_dir.parent.parent), name=run_dir.parent.name, version=run_dir.name)
        return type(logger)(**args)


class Parsed(Exception):
    """Raised by a TrainCLI made with parse_only, once the command line is parsed and nothing is built."""

    def __init__(self, cli: TrainCLI):
        super().__init__("parsed")
        self.cli = cli


def parse(stage: str, argv: list[str]) -> tuple[LightningArgumentParser, Namespace]:
    """Parse and check a command line (links and defaults applied) without building anything."""
    try:
        TrainCLI(argv, stage, parse_only=True)
    except Parsed as done:
        return done.cli.parser, done.cli.config
    raise AssertionError("TrainCLI(parse_only=True) returned without parsing")


class SeedError(ValueError):
    """--seed_everything out of range."""


class OptimizerError(ValueError):
    """The optimizer or schedule cannot be built from its arguments."""


def seed_value(seed) -> int:
    """The data module's seed for --seed_everything: the integer itself (true is resolved after parsing)."""
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else 0


def logger_init_args(logger) -> dict:
    """The init_args of a configured logger (a Namespace from the parser), as a plain dict."""
    if not logger or isinstance(logger, bool) or isinstance(logger, list):
        return {}
    init_args = logger.get("init_args") if isinstance(logger, (dict, Namespace)) else None
    if init_args is None:
        return {}
    return dict(init_args.as_dict() if isinstance(init_args, Namespace) else init_args)


def build(stage: str, argv: list[str], checkpoint: runs.Checkpoint | None = None, callbacks: tuple = ()):
    """Parse `argv` and build the model, data module and Trainer of a `stage` run (see TrainCLI)."""
    cli = TrainCLI(argv, stage, checkpoint, callbacks)
    return cli.model, cli.datamodule, cli.trainer, cli.run


def device_description(trainer) -> str:
    device = trainer.strategy.root_device
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def tf32_in_use(trainer) -> bool:
    return (trainer.strategy.root_device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
            and torch.backends.cudnn.allow_tf32)
