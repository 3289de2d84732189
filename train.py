"""Train, test and use image classifiers with the Lightning CLI (README.md shows the commands).

Every option is LightningCLI's: `--trainer.*` (any Trainer argument, callback or logger), `--model.*`, `--data.*`,
`--config FILE`, `--seed_everything`. `--model NAME` is the recipe configs/NAME.yaml, `--data NAME` a data module's
short name (datamodules.DATA). A run writes lightning_logs/version_N/: TensorBoard events, checkpoints/,
config.yaml (`--config` of it runs it again) and results.json.
"""

import fcntl
import inspect
import json
import os
import random
import signal
import sys
import time
import traceback
import zipfile
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
import yaml
from jsonargparse import Namespace
from jsonargparse.typing import register_type
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.callbacks.timer import Interval
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins import TorchCheckpointIO
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from packaging.version import InvalidVersion, Version

import datamodules
from datamodules import DataError
from datamodules.files import remove_leftovers, written_whole
from lit_models import NETWORKS, ImageClassifier, LastCheckpoint, ModelError, TimedProgressBar, TrainingSpeed
from lit_models.callbacks import WholeCheckpointIO
from lit_models.networks import import_class

# A torch.device in a configuration (StochasticWeightAveraging's default one) written and read back as its name:
# without it, config.yaml would hold "Unable to serialize instance cpu", and would not replay.
register_type(torch.device, serializer=str, deserializer=torch.device)
# Timer's default `interval`, a str enum that YAML's safe dumper refuses: written as the string it is.
yaml.SafeDumper.add_multi_representer(Interval, lambda dumper, value: dumper.represent_str(value.value))

RECIPES = Path(__file__).resolve().parent / "configs"
SUBCOMMANDS = ("fit", "validate", "test", "predict", "export")
USE_CALLBACKS = ("lit_models.Dashboards", "lit_models.TimedProgressBar")  # of DEFAULT_CALLBACKS, for test/predict
DEFAULT_CALLBACKS = [  # a Trainer default, so --trainer.callbacks+=X adds to it and a config may replace it
    {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
     "init_args": {"monitor": "val/acc", "mode": "max", "filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}",
                   "auto_insert_metric_name": False}},
    {"class_path": "lit_models.LastCheckpoint"},
    {"class_path": "lit_models.TrainingSpeed"},
    {"class_path": "lit_models.TimedProgressBar"},
    {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
    {"class_path": "lit_models.Dashboards"},
]


class UsageError(Exception):
    """A command line that cannot run (exit code 2)."""


class Stopped(Exception):
    """A run stopped by a signal; the message says where and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def usage() -> str:
    return (f"train.py [{'|'.join(SUBCOMMANDS)}] [--model {'|'.join(recipes())}] [--data {'|'.join(datamodules.DATA)}] "
            f"[--config FILE] [--ckpt_path CKPT] [--trainer.*] [--model.*] [--data.*]")


class TrainCLI(LightningCLI):
    """LightningCLI for ImageClassifier (or a subclass) on any LightningDataModule, with the project's defaults:
    30 epochs; DEFAULT_CALLBACKS, which step aside where a flag or a callback of the user's takes their place; bf16
    mixed precision on GPUs that have it, unless `--trainer.precision` says otherwise; the use commands' options."""

    def __init__(self, args: list[str], subcommand: str = "fit", save_config_kwargs: dict | None = None):
        self.command, self.args = subcommand, args
        # The command line as LightningCLI parses it, in sys.argv: Lightning starts the other processes of a DDP run
        # with sys.argv, and they must run the same expanded command (the same seed, the same checkpoint).
        sys.argv[1:] = args
        super().__init__(ImageClassifier, subclass_mode_model=True, subclass_mode_data=True, run=False,
                         seed_everything_default=0, auto_configure_optimizers=False,
                         trainer_defaults={"max_epochs": 30, "benchmark": True},
                         save_config_callback=SaveConfigCallback if subcommand in ("fit", "test", "validate") else None,
                         save_config_kwargs=save_config_kwargs,
                         parser_kwargs={"usage": usage(), "description": __doc__.split("\n")[0]})

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"trainer.callbacks": DEFAULT_CALLBACKS})
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="fit: a checkpoint to resume, 'last' (the newest run's) or a run directory; "
                                 "test/validate/predict/export: the checkpoint to use, a run directory (its best), "
                                 "or 'best'/'last' of the newest run")
        if self.command == "predict":
            parser.add_argument("--inputs", type=str, nargs="+", default=None,
                                help="image files, folders (searched recursively) or globs; none: the test split of "
                                     "the checkpoint's data set, with its true labels")
        if self.command in ("predict", "export"):
            parser.add_argument("--output", type=str | None, default=None,
                                help="the file to write; default: a new file beside the checkpoint's run")
        if self.command == "export":
            parser.add_argument("--format", type=str, default="onnx", help="onnx, torchscript or pt2")

    def before_instantiate_classes(self) -> None:
        check_parts(self.config.model.init_args, self.args)
        trainer = self.config.trainer
        bare, no_logger = trainer.get("barebones"), trainer.logger is False or trainer.get("barebones")
        if no_logger:  # no run directory: one config.yaml for every run
            self.save_config_callback = None
        callbacks = trainer.callbacks or []  # a default given again (`+=` with its settings) is the user's too
        ours = {i for i, c in enumerate(callbacks) if is_default(c) and c not in callbacks[:i]}
        mine = [c for i, c in enumerate(callbacks) if i not in ours]
        theirs = [import_class(c.class_path) for c in mine]
        checkpoints = [c for c, cls in zip(mine, theirs) if issubclass(cls, ModelCheckpoint)]

        def steps_aside(cls) -> bool:  # a default, for a flag or a callback of the user's (no logger: nothing to log)
            return issubclass(cls, ModelCheckpoint) and (trainer.enable_checkpointing is False or bare) or \
                cls is ModelCheckpoint and any(import_class(c.class_path) is not LastCheckpoint for c in checkpoints) \
                or cls is LastCheckpoint and any((c.init_args or {}).get("save_last") for c in checkpoints) or \
                cls is LearningRateMonitor and (no_logger or any(issubclass(c, LearningRateMonitor) for c in theirs)) \
                or cls is TimedProgressBar and (trainer.enable_progress_bar is False or bare or
                                                any(issubclass(c, ProgressBar) for c in theirs))
        trainer.callbacks = [c for i, c in enumerate(callbacks) if i not in ours or
                             not steps_aside(import_class(c.class_path))]
        if trainer.precision is None and torch.cuda.is_available() and torch.cuda.is_bf16_supported() \
                and trainer.accelerator in ("auto", "gpu", "cuda"):
            trainer.precision = "bf16-mixed"  # on a CPU, 32-bit: bf16 autocast is slower there
        if torch.cuda.is_available():
            torch.set_float32_matmul_precision("high")  # TF32 for what stays in float32

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default, not a plugin of the user's
            trainer.strategy.checkpoint_io = WholeCheckpointIO()
        return trainer

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        # The network, sized from the data, before anything looks at the model: callbacks such as
        # StochasticWeightAveraging copy it when fitting starts. The statistics wait for the data to be downloaded
        # (prepare_data); the model takes them in configure_model, before Lightning logs its hyperparameters.
        if isinstance(self.model, ImageClassifier):
            self.model.take_from_data(self.datamodule, statistics=False)


def is_default(callback: Namespace) -> bool:
    """Whether a callback is one of DEFAULT_CALLBACKS (or a recipe's) as it comes: with settings of the user's, or
    of another class, it is the user's own."""
    for spec in DEFAULT_CALLBACKS:
        if callback.class_path == spec["class_path"]:
            wanted = class_defaults(spec["class_path"]) | spec.get("init_args", {})
            return all(value == wanted.get(key) for key, value in (callback.get("init_args") or {}).items())
    return False


def class_defaults(class_path: str) -> dict:
    parameters = inspect.signature(import_class(class_path)).parameters.items()
    return {name: p.default for name, p in parameters if p.default is not inspect.Parameter.empty}


def check_parts(model: Namespace, args: list[str]) -> None:
    """One learning rate: `--model.lr`, unless it is null. And a class given on the command line for a part of the
    model (`--model.net`, `--model.optimizer`, `--model.scheduler`) starts from its own defaults, not from settings
    that the configuration before it gave another class (jsonargparse keeps those the new class also takes)."""
    optimizer = model.get("optimizer")
    if isinstance(optimizer, Namespace) and "class_path" in optimizer:
        given = (optimizer.get("init_args") or Namespace()).get("lr")
        default = class_defaults(optimizer.class_path).get("lr")
        if model.get("lr") is not None and (option(args, "--model.optimizer.lr")[0] is not None or given != default):
            raise UsageError(f"--model.optimizer.lr {given}: the learning rate is --model.lr (the peak of OneCycle, "
                             f"what the learning-rate finder sets): give --model.lr {given}, or --model.lr null to "
                             f"use the optimizer's")
    for part in ("net", "optimizer", "scheduler"):
        chosen, spec = option(args, f"--model.{part}")[0], model.get(part)
        if chosen is None or chosen.lstrip().startswith("{") or not isinstance(spec, Namespace) or \
                not isinstance(spec.get("init_args"), Namespace):
            continue
        init, defaults = spec.init_args, class_defaults(spec.class_path)
        reset = sorted(key for key in init.keys() if key in defaults and init[key] != defaults[key] and
                       option(args, f"--model.{part}.{key}")[0] is None)
        for key in reset:
            init[key] = defaults[key]
        if reset:
            rank_zero_only(print)(f"--model.{part} {chosen} starts from its own defaults: {', '.join(reset)} of the "
                                  f"configuration before it are reset (--model.{part}.{reset[0]} ... sets one)",
                                  file=sys.stderr)


def read_checkpoint(path: Path) -> dict:
    """A checkpoint file's contents, checked to be an ImageClassifier's."""
    if not path.is_file():
        raise UsageError(f"--ckpt_path {path}: no such checkpoint file")
    try:  # torch's reader skips the zip's checksums: a damaged file would load
        damaged = zipfile.ZipFile(path).testzip()
    except (zipfile.BadZipFile, OSError, EOFError):  # not a whole zip: torch.load below says so
        damaged = None
    remove_leftovers(path.parent)  # of a write into its folder that was killed
    if damaged:
        raise ModelError(f"checkpoint {path} is damaged ({damaged} fails its check) or not a checkpoint")
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip, pickle and EOF errors alike: not a whole checkpoint
        raise ModelError(f"checkpoint {path} cannot be read; it may be truncated or not a checkpoint "
                         f"({type(e).__name__})") from None
    hparams = contents.get("hyper_parameters") if isinstance(contents, dict) else None
    if not isinstance(hparams, dict) or "net" not in hparams or "state_dict" not in contents:
        raise ModelError(f"{path} is not a checkpoint of an ImageClassifier (no state_dict, or no net among its "
                         f"hyperparameters)")
    try:
        Version(contents["pytorch-lightning_version"])  # what Lightning's loading reads first
    except (KeyError, TypeError, InvalidVersion):
        raise ModelError(f"{path} has no valid pytorch-lightning_version: it was edited or is damaged") from None
    return contents


def find_checkpoint(spec: str, prefer: str, root: str | None = None) -> Path:
    """The checkpoint `spec` names: a file; a run directory (its `prefer`: best or last); best/last of the newest run
    (by the time of its newest checkpoint) under `root` (default: here), wherever a logger put it: up to three
    folders deep (`lightning_logs/version_0`, `logs/NAME/version_0`, `mlruns/ID/RUN`; a sweep's trials are deeper)."""
    path, root = Path(spec).expanduser(), Path(root or ".")
    if spec in ("best", "last") and not path.exists():
        folders = {f.parent for depth in range(4) for f in root.glob("*/" * depth + "checkpoints/*.ckpt")}
        if not folders:
            raise UsageError(f"--ckpt_path {spec}: no run with checkpoints in {root.resolve()} (or up to three "
                             f"folders below it); --trainer.default_root_dir DIR looks in DIR")
        path, prefer = max(folders, key=lambda f: max(c.stat().st_mtime for c in f.glob("*.ckpt"))).parent, spec
    if not path.is_dir():
        return path
    files = sorted((path / "checkpoints").glob("*.ckpt"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise UsageError(f"--ckpt_path {spec}: no checkpoints in {path / 'checkpoints'}")
    if prefer == "best":  # as the newest checkpoint's ModelCheckpoint state records it
        for state in read_checkpoint(files[-1]).get("callbacks", {}).values():
            best = Path(state.get("best_model_path") or "") if state.get("monitor") else None
            if best and (path / "checkpoints" / best.name).is_file():
                return path / "checkpoints" / best.name
    last = path / "checkpoints" / "last.ckpt"
    return last if last.is_file() else files[-1]


def option(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of `--name VALUE` / `--name=VALUE` in args (the last given), and args without it."""
    value, rest, i = None, [], 0
    while i < len(args):
        if args[i] == name and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif args[i].startswith(name + "="):
            value, i = args[i].split("=", 1)[1], i + 1
        else:
            rest, i = rest + [args[i]], i + 1
    return value, rest


def replay_args(args: list[str], subcommand: str) -> tuple[Path, dict, list[str]]:
    """The checkpoint a use command names, its contents, and the command's arguments: the run's config.yaml, the
    model as the checkpoint holds it, the user's options."""
    spec, rest = option(args, "--ckpt_path")
    if spec is None:
        raise UsageError(f"{subcommand} needs --ckpt_path: a checkpoint file, a run directory, or best/last")
    path = find_checkpoint(spec, "best", option(rest, "--trainer.default_root_dir")[0]).resolve()
    contents = read_checkpoint(path)
    hparams = dict(contents["hyper_parameters"])
    model = {"class_path": hparams.pop("_class_path", "lit_models.ImageClassifier"),
             "init_args": {k: v for k, v in hparams.items() if not k.startswith("_")}}
    config = path.parent.parent / "config.yaml"
    if config.is_file():
        base = ["--config", str(config)]
    else:  # a checkpoint moved out of its run: its data module's own hyperparameters
        data = dict(contents.get("datamodule_hyper_parameters") or {})
        if "_class_path" not in data and "--data" not in rest:
            raise UsageError(f"{path} does not say which data set it was trained on and has no config.yaml beside "
                             f"its folder: pass --data NAME (and its options)")
        init = {k: v for k, v in data.items() if not k.startswith("_")}
        base = [f"--data={json.dumps({'class_path': data['_class_path'], 'init_args': init})}"] if data else []
    net = model["init_args"]["net"]["class_path"].rpartition(".")[2]
    rank_zero_only(print)(f"Using {path} ({net}, epoch {contents.get('epoch')}, "
                          f"step {contents.get('global_step')})")
    # One process (a DDP run's too), and none of the run's training callbacks (checkpoints, averaging, finders),
    # only its dashboards and bar: `--trainer.callbacks+=X` adds one of the user's.
    use = ["--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
           f"--trainer.callbacks={json.dumps([c for c in DEFAULT_CALLBACKS if c['class_path'] in USE_CALLBACKS])}"]
    if option(rest, "--trainer.logger")[0] is None:  # not a new run: predict and export log nothing, a test
        # logs in a folder of the run it tests (TensorBoard shows it under the run), unless a logger is given
        if subcommand in ("predict", "export") or not config.is_file():
            use.append("--trainer.logger=false")
        elif logger := logger_in(config, save_dir=path.parent.parent / subcommand, name="", version=None):
            use.append(f"--trainer.logger={logger}")
    return path, contents, expand(base + use + [f"--model={json.dumps(model)}"] + rest, default_recipe=False) + \
        ["--ckpt_path", str(path)]


def logger_in(config: Path, **where) -> str | None:
    """The run's logger (in its config.yaml) as a --trainer.logger value that writes `where` (save_dir, name,
    version); None for loggers that keep runs elsewhere (MLflow's store), which log as the run did."""
    spec = (yaml.safe_load(config.read_text()) or {}).get("trainer", {}).get("logger")
    spec = spec if isinstance(spec, dict) else {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    if not spec["class_path"].endswith(("TensorBoardLogger", "CSVLogger")):
        return None
    init = {**(spec.get("init_args") or {}), **{k: str(v) for k, v in where.items() if v is not None}}
    return json.dumps({"class_path": spec["class_path"], "init_args": init})


def expand(args: list[str], default_recipe: bool = True) -> list[str]:
    """`--model NAME` as the recipe's `--config` (first, so that what follows overrides it), `--data NAME` and
    `--model.net NAME` as their class paths; without a recipe or config, the CNN's. `--seed_everything true` as the
    random seed it asks for (Lightning 2.6's seed_everything(None) takes 0)."""
    out, given, i = [], [], 0
    seed = str(random.randint(1, 2**31 - 1))
    args = [seed if a.lower() == "true" and j and args[j - 1] == "--seed_everything" else
            f"--seed_everything={seed}" if a.lower() == "--seed_everything=true" else a for j, a in enumerate(args)]
    while i < len(args):
        key, eq, value = args[i].partition("=")
        name = value if eq else args[i + 1] if i + 1 < len(args) else ""
        if key == "--model.net" and "." not in name and not name.lstrip().startswith("{"):
            if name not in NETWORKS:
                raise UsageError(f"unknown --model.net '{name}'; choose one of: {', '.join(NETWORKS)} (or a class "
                                 f"path)")
            out.append(f"--model.net={NETWORKS[name].__module__}.{NETWORKS[name].__qualname__}")
            i += 1 if eq else 2
        elif key in ("--model", "--data") and (eq or i + 1 < len(args)):
            value = value if eq else args[i + 1]
            i += 1 if eq else 2
            if key == "--model" and value in recipes():
                given += ["--config", str(RECIPES / f"{value}.yaml")]
            elif key == "--data" and value in datamodules.DATA:
                out.append(f"--data={datamodules.DATA[value].__module__}.{datamodules.DATA[value].__name__}")
            elif "." in value or value[:1].isupper() or value.lstrip()[:1] == "{":  # a class path, name or dict
                out.append(f"{key}={value}")
            else:
                names = recipes() if key == "--model" else list(datamodules.DATA)
                raise UsageError(f"unknown {key} '{value}'; choose one of: {', '.join(names)} (or a class path)")
        else:
            out.append(args[i])
            i += 1
    configs = [b for a, b in zip(out, out[1:]) if a in ("--config", "-c")] + \
        [a.split("=", 1)[1] for a in out if a.startswith("--config=")]
    if default_recipe and not given and not any(a.startswith("--model=") for a in out) and \
            not any(sets_model(config) for config in configs):  # a config of a few options goes on top of it
        given = ["--config", str(RECIPES / "cnn.yaml")]
    return given + out


def sets_model(config: str) -> bool:
    """Whether a --config file names a model (or cannot be read: jsonargparse then says why)."""
    with suppress(OSError, yaml.YAMLError, TypeError):
        return "model" in (yaml.safe_load(Path(config).read_text()) or {})
    return True


@contextmanager
def ctrl_c_stops_after_the_step(stopped: list):
    """The first Ctrl-C stops training as SIGTERM does, between two steps, with a checkpoint to resume from; a
    second one stops at once (Lightning's KeyboardInterrupt)."""
    def handler(signum, frame):
        stopped.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nStopping after this step (Ctrl-C again to stop at once) ...", file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def claim_version(logger) -> None:
    """A run's folder of its own: Lightning's loggers pick the next free version_N unlocked (pytorch-lightning#11418),
    so rank 0 (whose log_dir Lightning gives the others) picks and makes it under a lock of the loggers' folder."""
    first = rank_zero_only.rank == 0 and not int(os.environ.get("NODE_RANK", 0))  # (Lightning's rank ignores it)
    if first and isinstance(logger, (TensorBoardLogger, CSVLogger)):
        Path(logger.root_dir).mkdir(parents=True, exist_ok=True)
        folder = os.open(logger.root_dir, os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            Path(logger.log_dir).mkdir(parents=True, exist_ok=True)
        finally:
            os.close(folder)


def fit(cli: TrainCLI, verbose: bool = True) -> dict:
    """Fit, then test the best checkpoint (the last weights without one); results.json in the run's directory."""
    trainer, model, data, ckpt_path = cli.trainer, cli.model, cli.datamodule, cli.config.ckpt_path
    ctrl_c, start = [], time.perf_counter()
    claim_version(trainer.logger)
    try:
        with ctrl_c_stops_after_the_step(ctrl_c):
            trainer.fit(model, datamodule=data, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:
        last = next((c.saved_on_stop for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint)), None)
        saved = f"saved {last}; add --ckpt_path {last} to the same command to go on" if last else \
            "no checkpoint was written"
        raise Stopped(f"stopped by {'Ctrl-C' if ctrl_c else 'SIGTERM'} in epoch {trainer.current_epoch} at step "
                      f"{trainer.global_step}; {saved}", 130 if ctrl_c else 143) from None
    fit_seconds, epochs, step = time.perf_counter() - start, trainer.current_epoch, trainer.global_step
    # (as fit left them: a BatchSizeFinder callback also runs, and restores the trainer, when testing starts)
    # The test belongs to the fit's run: logging the hyperparameters again would reset TensorBoard's hp_metric to
    # Lightning's placeholder (-1), the value the HParams tab shows.
    trainer.enable_autolog_hparams = False
    best = next((c.best_model_path for c in sorted(trainer.checkpoint_callbacks, key=lambda c: not c.monitor)), "")
    try:
        if trainer.received_sigterm:  # after the last step: Lightning's loop ended, and its test would reset it
            raise SIGTERMException
        metrics = evaluate(trainer, "test", model, data, best or None, verbose)
    except SIGTERMException:
        run = trainer.log_dir if trainer.loggers else best or "CHECKPOINT"
        testing = trainer.state.fn == "test"
        when = "while testing after the fit, whose" if testing else "after the fit, before its test; its"
        raise Stopped(f"stopped by {'Ctrl-C' if ctrl_c else 'SIGTERM'} {when} checkpoints are whole: train.py test "
                      f"--ckpt_path {run} tests it", 130 if ctrl_c else 143) from None
    speed = next((c for c in trainer.callbacks if isinstance(c, TrainingSpeed)), TrainingSpeed())
    return report(cli, "fit", metrics, best or None, {
        "fit_seconds": round(fit_seconds, 2), "train_images_per_second": round(speed.images_per_second, 1),
        "train_epoch_seconds": [round(s, 4) for s in speed.epoch_seconds], "epochs": epochs, "global_step": step})


def evaluate(trainer, stage: str, model, data, ckpt_path: str | None, verbose: bool = True) -> dict:
    run = trainer.test if stage == "test" else trainer.validate
    results = run(model, datamodule=data, ckpt_path=ckpt_path, weights_only=True, verbose=verbose)
    if not results:
        raise UsageError(f"there is no {'test' if stage == 'test' else 'validation'} set to {stage} on "
                         f"(--data.val_size 0?): {'validate' if stage == 'test' else 'test'} instead")
    metrics = results[0]
    if trainer.received_sigterm:  # at the last batch Lightning's loop ends without raising: stop as it does before
        raise SIGTERMException
    return metrics | {"val/acc_best": float(model.val_acc_best.compute()) if model.val_acc_best.update_count else None}


def report(cli: TrainCLI, stage: str, metrics: dict, checkpoint: str | None, extra: dict) -> dict:
    """The record of a run: printed in one line, and written as results.json in its log directory."""
    trainer, model = cli.trainer, cli.model
    split = "val" if stage == "validate" else "test"
    record = {"stage": stage, "model": model.net_name,
              "data": getattr(cli.datamodule, "name", "") or type(cli.datamodule).__name__,
              f"{split}/acc": metrics.get(f"{split}/acc"), f"{split}/loss": metrics.get(f"{split}/loss"),
              "val/acc_best": metrics.get("val/acc_best"), "epochs": trainer.current_epoch,
              "global_step": trainer.global_step, **extra,
              "device": str(trainer.strategy.root_device), "precision": str(trainer.precision),
              "seed": cli.config.seed_everything, "checkpoint": checkpoint,
              "log_dir": trainer.log_dir if trainer.loggers else None,
              f"{split}/acc_per_class": {k.rsplit("/", 1)[1]: v for k, v in metrics.items()
                                         if k.startswith(f"{split}/acc_class/")} or None}
    if trainer.is_global_zero:
        if record["log_dir"]:
            finite = json.loads(json.dumps(record), parse_constant=lambda nan: None)  # NaN: null, valid JSON
            with written_whole(Path(record["log_dir"], "results.json")) as tmp:
                tmp.write_text(json.dumps(finite, indent=2) + "\n")
        best = record["val/acc_best"]
        validation = f"best val/acc {best:.4f}" if best is not None else "no validation"
        source = (f"({validation}) after {record['epochs']} epochs, fit in {record['fit_seconds']:.1f} s"
                  if stage == "fit" else f"from {checkpoint}")
        accuracy = record[f"{split}/acc"]
        accuracy = "not logged (--trainer.barebones)" if accuracy is None else f"{accuracy:.4f}"
        print(f"{record['model']} on {record['data']}: {split}/acc {accuracy}", source,
              f"on {record['device']};",
              f"logs in {record['log_dir']}" if record["log_dir"] else "no logger", flush=True)
    return record


def use(subcommand: str, args: list[str]) -> dict:
    """test / validate / predict / export a checkpoint, with its run's configuration and the user's overrides."""
    path, contents, args = replay_args(args, subcommand)
    cli = build(args, subcommand)
    try:
        return use_checkpoint(cli, subcommand, path, contents)
    except SIGTERMException:  # a SystemExit, with no code: it would exit 0
        raise Stopped(f"stopped by SIGTERM while {subcommand.rstrip('e')}ing {path}; no results were written", 143) \
            from None


def use_checkpoint(cli: TrainCLI, subcommand: str, path: Path, contents: dict) -> dict:
    from lit_models import export

    if cli.trainer.world_size > 1:  # Lightning would start the other processes with a command line that fits
        raise UsageError(f"{subcommand} runs in one process: leave out --trainer.devices/num_nodes/strategy")
    if subcommand == "export" and cli.config.format not in export.FORMATS:
        raise UsageError(f"--format {cli.config.format}: choose one of {', '.join(export.FORMATS)}")
    cli.model.check_weights(contents["state_dict"])  # a checkpoint edited by hand: refused before anything starts
    if subcommand in ("test", "validate"):  # Lightning loads the weights from ckpt_path
        claim_version(cli.trainer.logger)
        return report(cli, subcommand, evaluate(cli.trainer, subcommand, cli.model, cli.datamodule, str(path)),
                      str(path), {})
    cli.model.load_state_dict(contents["state_dict"])
    if subcommand == "export":
        return export.export(cli.model, cli.datamodule, cli.config.format, cli.config.output, path)
    return export.predict(cli.trainer, cli.model, cli.datamodule, path, cli.config.inputs, cli.config.output)


def run(argv: list[str]) -> dict:
    """Run one command line in this process; its record."""
    subcommand = argv[0] if argv and argv[0] in SUBCOMMANDS else "fit"
    args = argv[1:] if argv and argv[0] == subcommand else argv
    if args and not args[0].startswith("-"):
        raise UsageError(f"unknown subcommand '{args[0]}'; choose one of: {', '.join(SUBCOMMANDS)}")
    if subcommand != "fit":
        if "--help" in args or "-h" in args:
            build(expand(args, default_recipe=False), subcommand)  # prints its options and exits
        return use(subcommand, args)
    spec, rest = option(args, "--ckpt_path")
    kwargs = {}
    if spec is None and int(os.environ.get("SLURM_RESTART_COUNT", 0)) and SLURMEnvironment.detect():
        # A requeued job: Lightning resumes its hpc checkpoint, in the run directory the default logger names by the
        # job's id, where the job's first config.yaml stays
        kwargs["save_config_kwargs"] = {"config_filename": "config-resumed.yaml", "overwrite": True}
    if spec is not None:
        path = find_checkpoint(spec, "last", option(rest, "--trainer.default_root_dir")[0]).resolve()
        contents = read_checkpoint(path)
        missing = [key for key in ("optimizer_states", "lr_schedulers", "loops") if key not in contents]
        if missing:
            raise ModelError(f"{path} cannot resume training: it has no {', '.join(missing)} (weights only?); "
                             f"test, predict or export it, or start a new run")
        rank_zero_only(print)(f"Resuming {path}")
        rest += ["--ckpt_path", str(path)]
        run_dir = path.parent.parent
        given = any(a.split("=")[0] in ("--config", "-c", "--model") for a in rest)
        has_config = (run_dir / "config.yaml").is_file()
        if not given and has_config:  # the run's own configuration, then the user's options
            rest = ["--config", str(run_dir / "config.yaml"), *rest]
        logger = path.parent.name == "checkpoints" and has_config and option(rest, "--trainer.logger")[0] is None \
            and logger_in(run_dir / "config.yaml", save_dir=run_dir.parent.parent, name=run_dir.parent.name,
                          version=run_dir.name)
        if logger:  # the run's logger would start a new version: go on in the run's own directory instead
            rest.append(f"--trainer.logger={logger}")
            kwargs["save_config_kwargs"] = {"config_filename": "config-resumed.yaml", "overwrite": True}
    cli = build(expand(rest), **kwargs)
    if spec is not None and cli.trainer.max_epochs not in (None, -1) and \
            (done := contents["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"]) >= cli.trainer.max_epochs:
        # As Lightning's fit of it would: nothing to train. And no test after it, to rewrite the run's results.json.
        cli.model.check_weights(contents["state_dict"])
        print(f"{path} finished its {done} epochs: nothing to train (a larger --trainer.max_epochs trains on; "
              f"train.py test --ckpt_path {path} tests it again)", file=sys.stderr)
        return {}
    return fit(cli)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    try:
        run(argv)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # gloo's threads would abort the interpreter's exit
        return 0
    except SystemExit as e:  # jsonargparse: a help printed (0) or a command-line error reported (2)
        return e.code if isinstance(e.code, int) else 0
    except Exception as e:
        code, message = explain(e)
        if code is None or verbose:
            traceback.print_exc()
        if code is None:
            return 1
        print(f"train.py: error: {message}", file=sys.stderr)
        return code


def explain(error: BaseException) -> tuple[int | None, str]:
    """The exit code and one line for what a user can fix, found among the error and its causes (jsonargparse
    wraps what a class raises while it builds it); (None, "") for a bug."""
    e, depth = error, 0
    while e is not None and depth < 20:
        if isinstance(e, Stopped):
            return e.exit_code, str(e)
        if isinstance(e, (UsageError, MisconfigurationException)):
            return 2, str(e)
        if isinstance(e, (DataError, ModelError)):
            return 1, str(e)
        if isinstance(e, torch.OutOfMemoryError):
            return 1, "out of memory on the device: try a smaller --data.batch_size (or --data.on_device false)"
        if isinstance(e, MemoryError):
            return 1, "out of memory in this machine's RAM: try a smaller --data.image_size or fewer images"
        if isinstance(e, ModuleNotFoundError):
            return 1, f"this needs the package '{e.name}' (pip install {e.name})" if e.name else str(e)
        if isinstance(e, OSError) and e.strerror:
            return 1, f"{e.strerror}: {e.filename or ''}"
        e, depth = e.__cause__ or e.__context__, depth + 1
    return None, ""


def build(args: list[str], subcommand: str = "fit", **kwargs) -> TrainCLI:
    """TrainCLI(args): a class that cannot be built from the command line is the command line's error (exit 2)."""
    try:
        return TrainCLI(args, subcommand, **kwargs)
    except (ValueError, TypeError) as e:
        if explain(e)[0] is not None:
            raise
        raise UsageError(f"the command line does not build: {e}") from e


if __name__ == "__main__":
    sys.exit(main())
