"""Runs and their checkpoints: which file `--ckpt_path best|last|RUN` names, whether it is whole,
whether it can resume, and the run folder a new run or test claims for itself."""

import fcntl
import json
import os
import sys
import zipfile
from pathlib import Path

import torch
import yaml
from jsonargparse.typing import register_type
from lightning.pytorch.callbacks.timer import Interval
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only
from packaging.version import InvalidVersion, Version

from lit_cli.defaults import USE_CALLBACKS
from lit_cli.errors import UsageError
from lit_common.files import Claimed, remove_leftovers
from lit_models import ModelError

# Written to config.yaml and read back: a torch.device (StochasticWeightAveraging's default) as its
# name; Timer's `interval`, a str enum that YAML's safe dumper refuses, as the string it is.
register_type(torch.device, serializer=str, deserializer=torch.device)
yaml.SafeDumper.add_multi_representer(Interval, lambda dumper, v: dumper.represent_str(v.value))

# How far below the starting folder `best`/`last` look for runs: lightning_logs/version_0,
# logs/NAME/version_0, mlruns/ID/RUN. A sweep's trials lie deeper, and are not taken.
DEPTH = 3


def option(args: list[str], key: str) -> tuple[str | None, list[str]]:
    """The value the command line gives `key` (`--key V` or `--key=V`; the last one), and the
    command line without it."""
    value, rest, i = None, [], 0
    while i < len(args):
        if args[i] == key and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif args[i].startswith(key + "="):
            value, i = args[i].split("=", 1)[1], i + 1
        else:
            rest, i = rest + [args[i]], i + 1
    return value, rest


def replay(subcommand: str, spec: str, args: list[str],
           configured: bool = False) -> tuple[list[str], list[str]]:
    """What `--ckpt_path SPEC` puts before the command line's own options, and those options
    with the checkpoint's file as `--ckpt_path`. First the run's config.yaml (a checkpoint moved
    out of its run: the data module it names), unless a fit is `configured` by a `--config` or
    `--model` of the command line. Resuming a fit: the run's own logger, so that it goes on in its
    folder. Testing, validating, predicting or exporting: one process, the dashboards and progress
    bar of the defaults, a logger inside the run (test, validate) or none, and the model as the
    checkpoint holds it."""
    _, args = option(args, "--ckpt_path")
    root = option(args, "--trainer.default_root_dir")[0]
    prefer = {"fit": "last"}.get(subcommand, "best")
    path = find_checkpoint(spec, prefer, root).resolve()
    contents = read_checkpoint(path)
    config = path.parent.parent / "config.yaml"
    logger_given = option(args, "--trainer.logger")[0] is not None
    base = []
    if subcommand != "fit" or not configured:
        base = run_configuration(path, contents, args)
    if subcommand == "fit":
        check_resumable(path, contents)
        if not logger_given:
            base += own_logger(path, config)
        rank_zero_only(print)(f"Resuming {path}")
    else:
        base += use_settings(subcommand, path, config, logger_given)
        model = model_spec(contents)
        if model is not None:
            base.append(f"--model={json.dumps(model)}")
        rank_zero_only(print)(f"Using {path} (epoch {contents.get('epoch')}, step "
                              f"{contents.get('global_step')})")
    return base, [*args, "--ckpt_path", str(path)]


def run_configuration(path: Path, contents: dict, args: list[str]) -> list[str]:
    """The run's config.yaml; for a checkpoint moved out of its run, the data module its
    hyperparameters name."""
    config = path.parent.parent / "config.yaml"
    if config.is_file():
        read_config(config)  # damaged or hand-edited: said here, in one line
        return ["--config", str(config)]
    data = data_spec(contents)
    if data is not None:
        return [f"--data={json.dumps(data)}"]
    if option(args, "--data")[0] is None:
        raise UsageError(f"{path} does not say which data set it was trained on and has no "
                         f"config.yaml beside its folder: pass --data NAME (and its options)")
    return []


def own_logger(path: Path, config: Path) -> list[str]:
    """The run's default logger, writing into the run's own folder (not a new version_N)."""
    run = path.parent.parent
    if path.parent.name != "checkpoints" or not config.is_file():
        return []
    logger = logger_in(config, save_dir=run.parent.parent, name=run.parent.name, version=run.name)
    if logger is None:
        return []
    return [f"--trainer.logger={logger}"]


def use_settings(subcommand: str, path: Path, config: Path, logger_given: bool) -> list[str]:
    """One process, the defaults' dashboards and progress bar (`+=` adds one), and a logger:
    a test or validation logs in a folder of the run it uses (TensorBoard shows it under the
    run); predict and export log nothing."""
    settings = ["--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
                f"--trainer.callbacks={json.dumps(USE_CALLBACKS)}"]
    if logger_given:
        return settings
    if subcommand in ("predict", "export") or not config.is_file():
        return settings + ["--trainer.logger=false"]
    # A logger that keeps its runs elsewhere (MLflow's store) logs as the run did.
    logger = logger_in(config, save_dir=path.parent.parent / subcommand, name="", version=None)
    if logger is None:
        return settings
    return settings + [f"--trainer.logger={logger}"]


def find_checkpoint(spec: str, prefer: str, root: str | None = None) -> Path:
    """The checkpoint `spec` names: a file; a run folder (its `prefer`: best or last); or
    best/last of the newest run below `root` (default: here), by the time of its newest
    checkpoint."""
    path = Path(spec).expanduser()
    if spec in ("best", "last") and not path.exists():
        path, prefer = newest_run(spec, Path(root or ".")), spec
    if not path.is_dir():
        return path
    files = sorted((path / "checkpoints").glob("*.ckpt"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise UsageError(f"--ckpt_path {spec}: no checkpoints in {path / 'checkpoints'}")
    best = None
    if prefer == "best":
        best = best_checkpoint(files[-1])
    last = path / "checkpoints" / "last.ckpt"
    if best is None and last.is_file():
        best = last
    return best or files[-1]


def newest_run(spec: str, root: Path) -> Path:
    """The run folder below `root` whose checkpoints were written last, wherever a logger put it."""
    patterns = ["*/" * depth + "checkpoints/*.ckpt" for depth in range(DEPTH + 1)]
    folders = {f.parent for pattern in patterns for f in root.glob(pattern)}
    if not folders:
        raise UsageError(f"--ckpt_path {spec}: no run with checkpoints in {root.resolve()} (or up "
                         f"to three folders below it); --trainer.default_root_dir DIR looks in DIR")
    newest = max(folders, key=lambda f: max(c.stat().st_mtime for c in f.glob("*.ckpt")))
    return newest.parent


def best_checkpoint(newest: Path) -> Path | None:
    """The best checkpoint as the newest one's ModelCheckpoint state records it, if it is there."""
    for state in read_checkpoint(newest).get("callbacks", {}).values():
        if not state.get("monitor"):
            continue
        best = newest.parent / Path(state.get("best_model_path") or "").name
        if best.is_file():
            return best
    return None


def read_checkpoint(path: Path) -> dict:
    """A checkpoint file's contents, checked to be a whole Lightning checkpoint."""
    if not path.is_file():
        raise UsageError(f"--ckpt_path {path}: no such checkpoint file")
    try:  # torch's reader skips the zip's checksums: a damaged file would load
        damaged = zipfile.ZipFile(path).testzip()
    except (zipfile.BadZipFile, OSError, EOFError):  # not a whole zip: torch.load below says so
        damaged = None
    remove_leftovers(path.parent)  # of a write into its folder that was killed
    if damaged:
        raise ModelError(f"checkpoint {path} is damaged ({damaged} fails its check) or not a "
                         f"checkpoint")
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip, pickle and EOF errors alike: not a whole checkpoint
        raise ModelError(f"checkpoint {path} cannot be read; it may be truncated or not a "
                         f"checkpoint ({type(e).__name__})") from None
    check_contents(path, contents)
    return contents


def check_contents(path: Path, contents) -> None:
    """A ModelError unless `contents` holds a LightningModule's weights and Lightning's version."""
    if not isinstance(contents, dict) or not isinstance(contents.get("state_dict"), dict):
        raise ModelError(f"{path} is not a Lightning checkpoint (it has no state_dict)")
    try:
        Version(contents["pytorch-lightning_version"])  # what Lightning's loading reads first
    except (KeyError, TypeError, InvalidVersion):
        raise ModelError(f"{path} has no valid pytorch-lightning_version: it was edited or is "
                         f"damaged") from None


def check_resumable(path: Path, contents: dict) -> None:
    """A ModelError for a checkpoint of weights alone, which can be used but not trained on."""
    missing = [key for key in ("optimizer_states", "lr_schedulers", "loops") if key not in contents]
    if missing:
        raise ModelError(f"{path} cannot resume training: it has no {', '.join(missing)} (weights "
                         f"only?); test, predict or export it, or start a new run")


def stop_if_finished(path: str, contents: dict, max_epochs: int | None) -> None:
    """SystemExit(0) and one line where a resumed run has nothing left to train (its checkpoint
    has all of `max_epochs`), as Lightning's fit of it would; no test rewrites its record."""
    done = contents["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"]
    if max_epochs in (None, -1) or done < max_epochs:
        return
    print(f"{path} finished its {done} epochs: nothing to train (a larger --trainer.max_epochs "
          f"trains on; train.py test --ckpt_path {path} tests it again)", file=sys.stderr)
    raise SystemExit(0)


def model_spec(contents: dict) -> dict | None:
    """The model as a checkpoint holds it, as LightningCLI's `--model` takes it: {class_path,
    init_args}; None where its hyperparameters do not say (a model that saves none: its run's
    config.yaml does)."""
    hparams = dict(contents.get("hyper_parameters") or {})
    class_path = hparams.pop("_class_path", None)
    if class_path is None and "net" in hparams:  # an ImageClassifier saved from Python
        class_path = "lit_models.ImageClassifier"
    if class_path is None:
        return None
    init_args = {key: value for key, value in hparams.items() if not key.startswith("_")}
    return {"class_path": class_path, "init_args": init_args}


def data_spec(contents: dict) -> dict | None:
    """The data module a checkpoint was trained on, if the checkpoint says:
    {class_path, init_args}."""
    data = dict(contents.get("datamodule_hyper_parameters") or {})
    if "_class_path" not in data:
        return None
    init_args = {key: value for key, value in data.items() if not key.startswith("_")}
    return {"class_path": data["_class_path"], "init_args": init_args}


def logger_in(config: Path, **where) -> str | None:
    """The run's logger (in its config.yaml) as a --trainer.logger value that writes `where`
    (save_dir, name, version); None for loggers that keep their runs elsewhere (MLflow's store)."""
    spec = (read_config(config).get("trainer") or {}).get("logger")
    if not isinstance(spec, dict):  # the default one
        spec = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    if not spec["class_path"].endswith(("TensorBoardLogger", "CSVLogger")):
        return None
    given = {key: value if value is None else str(value) for key, value in where.items()}
    init = {**(spec.get("init_args") or {}), **given}  # version None: the next free one
    return json.dumps({"class_path": spec["class_path"], "init_args": init})


def read_config(config: Path) -> dict:
    """A run's config.yaml, read; a ModelError naming it where it is not a YAML mapping."""
    try:
        read = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        at = ""
        if where is not None:
            at = f" at line {where.line + 1}"
        raise ModelError(f"{config} is not valid YAML{at}: it holds the run's configuration, "
                         f"which --ckpt_path reads; mend it, or move it away and give --data "
                         f"NAME") from None
    if not isinstance(read, dict):
        raise ModelError(f"{config} is not a run's configuration (a YAML mapping)")
    return read


def log_dir(trainer) -> str | None:
    """The run's own folder, where a logger made one: TensorBoard's and CSV's `log_dir`; for a
    logger that keeps its runs elsewhere (MLflow, Weights & Biases), `save_dir/name/version`, where
    Lightning puts the run's checkpoints (and MLflow's file store the run itself). Lightning's
    `trainer.log_dir` is such a logger's save_dir, which every run would share."""
    if not trainer.loggers or trainer.fast_dev_run:  # Lightning's DummyLogger: no run folder
        return None
    logger = trainer.loggers[0]
    if isinstance(logger, (TensorBoardLogger, CSVLogger)):
        return trainer.log_dir  # (on every process: Lightning broadcasts it)
    save_dir = logger.save_dir or trainer.default_root_dir
    return str(Path(save_dir, str(logger.name), str(logger.version)).absolute())


def claim(logger) -> Claimed | None:
    """The run's folder of a command, claimed for it alone (Claimed: taken back if the command
    fails before it writes a checkpoint). Lightning's loggers pick the next free version_N without
    a lock (pytorch-lightning#11418): the launch's first process picks and makes it under a lock
    of the loggers' folder (Lightning gives the other processes its log_dir)."""
    first = rank_zero_only.rank == 0 and not int(os.environ.get("NODE_RANK", 0))
    if not (first and isinstance(logger, (TensorBoardLogger, CSVLogger))):
        return None
    root = Path(logger.root_dir).absolute()
    made = [p for p in [root, *root.parents] if not p.exists()]
    root.mkdir(parents=True, exist_ok=True)
    folder = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        return Claimed(Path(logger.log_dir), made)
    finally:
        os.close(folder)


class SaveConfig(SaveConfigCallback):
    """LightningCLI's config.yaml in the run's own folder (log_dir), none without a logger (predict,
    export, `--trainer.logger false`), where every run would share one. A resumed fit that goes on
    in its own folder (a --ckpt_path, or SLURM's requeue, where Lightning resumes its own
    checkpoint) saves its configuration beside the first, as config-resumed.yaml; another run in a
    folder that holds one is refused in one line. LightningCLI gives it `save_to_log_dir=False`:
    it saves in `save_config`, its documented extension point."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved or not trainer.loggers:
            return
        self.folder = log_dir(trainer)
        taken = trainer.is_global_zero and Path(self.folder, self.config_filename).is_file()
        resumed = bool(self.config.get("ckpt_path")) or requeued()
        if taken and stage == "fit" and resumed:
            self.config_filename, self.overwrite, taken = "config-resumed.yaml", True, False
        if trainer.strategy.broadcast(taken):  # on every process, so that all of them stop
            raise UsageError(f"{Path(self.folder, self.config_filename)} exists: the logger's run "
                             f"folder holds another run; give the logger a version of its own "
                             f"(--trainer.logger.version ...), or leave it to pick one")
        super().setup(trainer, pl_module, stage)

    def on_fit_start(self, trainer, pl_module) -> None:
        # A learning-rate finder (a tuner callback: Lightning runs it first) set the rate that runs.
        model = self.config.model.init_args
        found = pl_module.hparams.get("lr")
        if self.already_saved and trainer.is_global_zero and model.get("lr") != found:
            model.lr, self.overwrite = found, True
            self.save_config(trainer, pl_module, "fit")

    def save_config(self, trainer, pl_module, stage: str) -> None:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        target = str(Path(self.folder, self.config_filename))
        self.parser.save(self.config, target, skip_none=False, overwrite=self.overwrite,
                         multifile=self.multifile)


def requeued() -> bool:
    """Whether this is a SLURM job that SLURM requeued (it then counts a restart)."""
    return SLURMEnvironment.detect() and int(os.environ.get("SLURM_RESTART_COUNT", 0)) > 0
