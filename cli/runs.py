"""Where a run writes, and which checkpoint it starts from or evaluates.

Every run gets a new directory `lightning_logs/<model>-<data>/version_N/` (TensorBoardLogger's
numbering, one series per model and data set), claimed with an atomic mkdir so that runs started
together never share one. A resumed run continues in the directory its checkpoint came from, and a
requeued SLURM job in `lightning_logs/<model>-<data>/slurm_<job id>/`. Nothing an earlier run wrote is
overwritten.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class CheckpointError(Exception):
    """The checkpoint or run directory asked for cannot be used; the message says why."""


class NothingToDo(Exception):
    """A resumed run has already trained all it is asked to."""


@dataclass
class Checkpoint:
    path: Path
    run_dir: Path | None  # the run directory it was written in, if it sits in one's checkpoints/
    contents: dict

    @property
    def hparams(self) -> dict:
        return self.contents.get("hyper_parameters", {})

    def describe(self) -> str:
        hp = self.hparams
        return (f"{self.path} ({hp.get('arch', '?')} for {len(hp.get('class_names') or [])} classes, "
                f"epoch {self.contents.get('epoch', '?')}, step {self.contents.get('global_step', '?')})")


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint file at `path`, read and checked to be one of this project's."""
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip, pickle and EOF errors alike: the file is not a whole checkpoint
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} cannot be read; it may be truncated or not a checkpoint "
                              f"({reason[:200]})") from None
    if not isinstance(contents, dict) or "state_dict" not in contents:
        raise CheckpointError(f"{path} is not a Lightning checkpoint (it has no state_dict)")
    hp = contents.get("hyper_parameters", {})
    if not isinstance(hp, dict) or "arch" not in hp or not any(k.startswith("net.") for k in contents["state_dict"]):
        raise CheckpointError(f"{path} is a Lightning checkpoint of another project (no ImageClassifier in it)")
    path = path.resolve()
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
    return Checkpoint(path, run_dir, contents)


def run_name(arch: str, data: str) -> str:
    """The name of a model and data set's series of runs: `cnn-cifar10`."""
    return f"{arch}-{data}"


def run_dirs(root: Path) -> list[Path]:
    """The run directories under a logs root (`lightning_logs/*/version_*` and `slurm_*`), newest first."""
    found = [d for d in root.glob("*/*") if d.is_dir() and re.fullmatch(r"version_\d+|slurm_\w+", d.name)]
    return sorted(found, key=lambda d: d.stat().st_mtime, reverse=True)


def best_path(run_dir: Path) -> Path | None:
    """The run's best checkpoint by validation accuracy (as its last.ckpt records it), else its last.ckpt."""
    folder = run_dir / "checkpoints"
    last = folder / "last.ckpt"
    if last.is_file():
        try:
            callbacks = torch.load(last, map_location="cpu", weights_only=True).get("callbacks", {})
        except Exception:
            callbacks = {}
        for key, state in callbacks.items():
            best = Path(state.get("best_model_path") or "") if key.startswith("ModelCheckpoint") else None
            if best and best.name != "last.ckpt" and (folder / best.name).is_file():
                return folder / best.name
    others = sorted((p for p in folder.glob("*.ckpt") if p.name != "last.ckpt"), key=lambda p: p.stat().st_mtime)
    return others[-1] if others else (last if last.is_file() else None)


def find_checkpoint(spec: str, root: Path, name: str | None = None, prefer: str = "best") -> Checkpoint:
    """The checkpoint `--ckpt_path` names: a file; a run directory (its `prefer`red checkpoint); or
    "last"/"best": that checkpoint of the newest run under `root` (of the series `name`, if given)."""
    if spec in ("last", "best"):
        where = root / name if name else root
        candidates = run_dirs(root) if not name else [d for d in run_dirs(root) if d.parent == where]
        for run_dir in candidates:
            path = run_dir / "checkpoints" / "last.ckpt" if spec == "last" else best_path(run_dir)
            if path is not None and path.is_file():
                return read_checkpoint(path)
        series = f"{where}/*" if name else f"{root}/*/*"
        raise CheckpointError(f"--ckpt_path {spec}: no run in {series} has a checkpoint"
                              + (f" ({spec}.ckpt)" if spec == "last" else ""))
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "checkpoints").is_dir():
            raise CheckpointError(f"{path} is not a run directory with checkpoints (no {path / 'checkpoints'}/)")
        found = best_path(path) if prefer == "best" else path / "checkpoints" / "last.ckpt"
        if found is None or not found.is_file():
            raise CheckpointError(f"the run directory {path} has no checkpoints")
        path = found
    return read_checkpoint(path)


def claim_run_dir(root: Path, version: str | int | None = None) -> Path:
    """Create and return a new run directory under `root`: the next `version_N`, or `version` if given.

    mkdir is atomic: of two runs that start together, each gets its own directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    if version is not None:
        run_dir = root / (version if isinstance(version, str) else f"version_{version}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            raise CheckpointError(f"{run_dir} holds an earlier run; choose another --trainer.logger.init_args.version, "
                                  f"or continue that run with --ckpt_path {run_dir}") from None
        return run_dir
    while True:
        taken = [int(m.group(1)) for d in root.iterdir() if (m := re.fullmatch(r"version_(\d+)", d.name))]
        run_dir = root / f"version_{max(taken, default=-1) + 1}"
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:  # another run took it between listing and mkdir: take the next
            continue


def newest_run_dir(root: Path) -> Path | None:
    """The highest version_N under `root`: on ranks other than 0, the one rank 0 has claimed."""
    taken = [(int(m.group(1)), d) for d in root.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", d.name))]
    return max(taken)[1] if taken else None


def slurm_run_dir(root: Path) -> Path | None:
    """Under SLURM, the job's own run directory: a requeued job comes back to it with its job id."""
    job = os.environ.get("SLURM_JOB_ID")
    return root / f"slurm_{job}" if job else None


def discard_if_unused(run, trained: bool = False) -> None:
    """Undo what a run that failed early wrote: a new run's directory if it holds no checkpoint or results (an
    empty or config-only directory is no run), with the folders above it if they are left empty; for a resumed
    run that trained nothing, the files it added to its directory (a config, an events file)."""
    run_dir = getattr(run, "dir", None)
    if run_dir is None or not run_dir.is_dir():
        return
    if run.resumed is not None:
        if not trained:
            for path in set(run_dir.rglob("*")) - run.existing:
                if path.is_file():
                    path.unlink()
        return
    if (run_dir / "checkpoints").exists() or (run_dir / "results.json").exists():
        return
    for path in sorted(run_dir.rglob("*"), reverse=True):  # only files this run wrote: config, events
        path.rmdir() if path.is_dir() else path.unlink()
    for folder in (run_dir, run_dir.parent, run_dir.parent.parent):
        try:
            folder.rmdir()
        except OSError:  # not empty: other runs are in it
            break


def free_name(folder: Path, pattern: str) -> str:
    """The first of pattern.format(1), pattern.format(2), ... that is not in `folder` yet."""
    k = 1
    while (folder / pattern.format(k)).exists():
        k += 1
    return pattern.format(k)


def check_unfinished(checkpoint: Checkpoint, max_epochs: int | None, max_steps: int, run_dir: Path | None) -> None:
    """NothingToDo if the checkpoint's run has trained all of `max_epochs` / `max_steps` already."""
    epochs = checkpoint.contents.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    done = epochs.get("processed", 0)
    step = checkpoint.contents.get("global_step", 0)
    if (max_epochs is not None and max_epochs >= 0 and done >= max_epochs) or 0 <= max_steps <= step:
        raise NothingToDo(f"{checkpoint.path} has already trained its {done} epochs ({step} steps): nothing to do. "
                          f"`python train.py test --ckpt_path {run_dir or checkpoint.path}` tests it again; a larger "
                          f"--trainer.max_epochs extends a run with a constant learning rate.")


def check_compatible(checkpoint: Checkpoint, model: torch.nn.Module, data_name: str) -> None:
    """Refuse a checkpoint whose weights or classes do not fit the model and data this run builds."""
    theirs, ours = checkpoint.contents["state_dict"], model.state_dict()
    hp, mine = checkpoint.hparams, model.hparams
    same_weights = set(theirs) == set(ours) and all(theirs[k].shape == ours[k].shape for k in ours)
    if not same_weights:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} is from another model ({hp.get('arch', '?')} for "
            f"{hp.get('num_classes', '?')} classes of {tuple(hp.get('image_shape', ()))} images); this run builds "
            f"{mine.arch} for {mine.num_classes} classes of {tuple(mine.image_shape)} images")
    if list(hp.get("class_names") or []) != list(model.class_names):
        theirs_names = ", ".join((hp.get("class_names") or [])[:4])
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was trained on other classes ({theirs_names}, ...) than this run's "
            f"{data_name} ({', '.join(model.class_names[:4])}, ...); resume it with the data set it was trained on")


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, say)."""


class NamedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, with a failed write (a full or read-only disk) reported in one line that
    names the file. Lightning already writes through a temporary file that it discards on failure, so the
    file under the checkpoint's name, if there is one, is still the previous whole checkpoint."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        try:
            super().save_checkpoint(checkpoint, path, storage_options)
        except OSError as e:
            raise CheckpointWriteError(f"could not write the checkpoint {path} ({e.strerror or e}); the checkpoints "
                                       f"written before it are whole. Free some space and resume with "
                                       f"--ckpt_path last") from None
