"""Runs and their checkpoints: the one file `--ckpt_path best|last|RUN` names, whether it is a
whole checkpoint, and what its run brings to the command (command_line.py's third rule)."""

import json
import os
import zipfile
from pathlib import Path

import torch
import yaml
from jsonargparse.typing import register_type
from lightning.pytorch.callbacks.timer import Interval
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_only

from lit_cli.errors import UsageError
from lit_models import ModelError
from lit_models.callbacks import run_folder

# Written to config.yaml and read back: a torch.device (StochasticWeightAveraging's default) as its
# name; Timer's `interval`, a str enum that YAML's safe dumper refuses, as the string it is.
register_type(torch.device, serializer=str, deserializer=torch.device)
yaml.SafeDumper.add_multi_representer(Interval, lambda dumper, v: dumper.represent_str(v.value))

# How far below the starting folder `best`/`last` look for runs: lightning_logs/version_0,
# logs/NAME/version_0, mlruns/ID/RUN. A sweep's trials and a test's logs lie deeper.
DEPTH = 3


def pairs(args: list[str]):
    """The command line as (option, value) pairs: `--key=value` and `--key value` alike; a lone
    argument is an option without a value."""
    i = 0
    while i < len(args):
        key, eq, value = args[i].partition("=")
        takes_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
        if takes_next and key.startswith("-"):
            yield key, args[i + 1]
            i += 2
        else:
            yield (key, value) if eq else (args[i], None)
            i += 1


def option(args: list[str], key: str) -> str | None:
    """The value the command line gives `key` (`--key V` or `--key=V`; the last one)."""
    return dict(pairs(args)).get(key)


def replay(subcommand: str, spec: str, args: list[str], configured: bool) -> list[str]:
    """The command line with `--ckpt_path SPEC` as the file it names, after what its run brings.
    A fit goes on with the run's config.yaml (unless the command line configures a model of its
    own) and its logger, in the run's folder. The use commands (test, validate, predict, export)
    take the checkpoint's own model and data, in one process, logging inside the run (test,
    validate) or nowhere (predict, export). The command line's own options come last, and win."""
    args = [k if v is None else f"{k}={v}" for k, v in pairs(args) if k != "--ckpt_path"]
    root = Path(option(args, "--trainer.default_root_dir") or ".")
    path = checkpoint(spec, subcommand, root).resolve()
    contents = read_checkpoint(path)
    run = path.parent.parent
    config = run / "config.yaml"
    if subcommand == "fit":
        if "optimizer_states" not in contents:  # else Lightning ends in a KeyError, a traceback
            raise UsageError(f"{path} holds weights alone, no optimizer state to go on from: "
                             f"test, predict or export it, or start a new run")
        base = []
        if not configured:
            base = ["--config", str(config)] if config.is_file() else parts(path, contents, args)
        if option(args, "--trainer.logger") is None:
            base += own_logger(run, config)
        rank_zero_only(print)(f"Resuming {path}")
    else:
        base = parts(path, contents, args) + ["--trainer.devices=1", "--trainer.num_nodes=1"]
        if subcommand in ("predict", "export"):
            base.append("--trainer.logger=false")
        elif not option(args, "--trainer.default_root_dir") and path.parent.name == "checkpoints":
            base.append(f"--trainer.default_root_dir={run / subcommand}")
        rank_zero_only(print)(f"Using {path} (epoch {contents.get('epoch')}, step "
                              f"{contents.get('global_step')})")
    return [*base, *args, "--ckpt_path", str(path)]


def checkpoint(spec: str, subcommand: str, root: Path) -> Path:
    """The file `spec` names: a checkpoint file; a run folder (a fit goes on from its last one, a
    use command takes its best, or its last where it has none); best or last of the newest run
    below `root`, which is an error where that run has none."""
    path = Path(spec).expanduser()
    if spec in ("best", "last") and not path.exists():
        return run_file(newest_run(spec, root), spec)
    if path.is_dir():
        use_best = subcommand != "fit" and record(path).get("best_model_path") is not None
        return run_file(path, "best" if use_best else "last")
    return path


def run_file(run: Path, which: str) -> Path:
    """The run's best checkpoint (as its record names it) or its last one (checkpoints/last.ckpt);
    a UsageError where it has none."""
    found = run / "checkpoints" / "last.ckpt"
    if which == "best":
        found = Path(record(run).get("best_model_path") or run / "no best checkpoint")
    if not found.is_file():
        raise UsageError(f"--ckpt_path {which}: the run {run} has no {which} checkpoint (a fit "
                         f"without validation or checkpoints keeps none); give a checkpoint file")
    return found


def newest_run(spec: str, root: Path) -> Path:
    """The run below `root` (up to DEPTH folders down) that wrote its configuration or record last,
    wherever a logger put it."""
    records = [f for depth in range(DEPTH) for pattern in ("config*.yaml", "results.json")
               for f in root.glob("*/" * (depth + 1) + pattern)]
    if not records:
        raise UsageError(f"--ckpt_path {spec}: no run in {root.resolve()} (or up to three folders "
                         f"below it); --trainer.default_root_dir DIR looks in DIR")
    return max(records, key=lambda f: f.stat().st_mtime).parent


def record(run: Path) -> dict:
    """The run's results.json; an empty one where it has none."""
    try:
        return json.loads((run / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def read_checkpoint(path: Path) -> dict:
    """A checkpoint file's contents; a ModelError naming it where it is not a whole Lightning
    checkpoint (torch's reader skips the zip's checksums: a damaged file would load)."""
    if not path.is_file():
        raise UsageError(f"--ckpt_path {path}: no such checkpoint file")
    try:
        damaged = zipfile.ZipFile(path).testzip()
        contents = torch.load(path, map_location="cpu", weights_only=True)
        lightning = isinstance(contents, dict) and "pytorch-lightning_version" in contents
    except Exception as e:  # zip, pickle and EOF errors alike
        damaged, lightning = f"{type(e).__name__}", False
    if damaged or not lightning:
        raise ModelError(f"checkpoint {path} cannot be read ({damaged or 'no Lightning version'}"
                         f"): it is truncated, damaged or not a Lightning checkpoint")
    return contents


def parts(path: Path, contents: dict, args: list[str]) -> list[str]:
    """The model and data module a checkpoint was made of (LightningCLI saves their class paths
    with their settings), as a configuration beneath the command line: as `--model` and `--data`,
    each class would start from its own defaults (command_line.from_own_defaults)."""
    given = {}
    for key, hparams in (("model", "hyper_parameters"), ("data", "datamodule_hyper_parameters")):
        saved = dict(contents.get(hparams) or {})
        class_path = saved.pop("_class_path", None)
        if class_path is None and key == "model" and "net" in saved:  # saved from Python
            class_path = "lit_models.ImageClassifier"
        if class_path is not None:
            init = {k: v for k, v in saved.items() if not k.startswith("_")}
            given[key] = {"class_path": class_path, "init_args": init}
        elif option(args, f"--{key}") is None:
            raise UsageError(f"{path} does not say which {key} it was made of: pass --{key}")
    return ["--config", json.dumps(given)]


def own_logger(run: Path, config: Path) -> list[str]:
    """The run's logger (TensorBoard's or CSV's) writing on in the run's own folder, not a new one;
    other loggers (MLflow, W&B) start a run of their own."""
    try:  # a config.yaml damaged by hand: jsonargparse refuses it in one line as it reads it
        spec = yaml.safe_load(config.read_text(encoding="utf-8"))["trainer"]["logger"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        spec = None
    if not isinstance(spec, dict):  # Lightning's default
        spec = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    with_folders = spec["class_path"].endswith(("TensorBoardLogger", "CSVLogger"))
    if not (run / "checkpoints").is_dir() or not with_folders:
        return []
    where = {"save_dir": str(run.parent.parent), "name": run.parent.name, "version": run.name}
    logger = {"class_path": spec["class_path"], "init_args": {**spec.get("init_args", {}), **where}}
    return [f"--trainer.logger={json.dumps(logger)}"]


class SaveConfig(SaveConfigCallback):
    """LightningCLI's config.yaml, in the run's own folder (`run_folder`), none where a command logs
    nowhere: LightningCLI's goes to `trainer.log_dir`, the working folder without a logger and the
    save_dir every MLflow or W&B run shares, and refuses the second run there
    (Lightning-AI/pytorch-lightning#17168). A fit that goes on in its folder saves
    config-resumed.yaml beside the first. LightningCLI gives it `save_to_log_dir=False`."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        folder = run_folder(trainer)
        path = Path(folder or ".", self.config_filename)
        # No folder, or a fit's own test (under ddp_spawn, in processes that did not save it)
        if folder is None or path.exists() and stage != "fit":
            return
        # A fit going on in its folder: from --ckpt_path, or SLURM's requeue of its job.
        resumed = self.config.get("ckpt_path") or os.environ.get("SLURM_RESTART_COUNT", "0") != "0"
        if path.exists() and resumed:
            path = path.with_name("config-resumed.yaml")
        elif path.exists():
            raise UsageError(f"{path} exists: the logger's run folder holds another run; give the "
                             f"logger a version of its own, or leave it to pick one")
        path.parent.mkdir(parents=True, exist_ok=True)  # before the logger made it (W&B)
        self.parser.save(self.config, str(path), skip_unset=False, overwrite=True,
                         multifile=self.multifile)
