"""Which checkpoint a run resumes from, and which run directory it writes to.

Every run gets a new lightning_logs/version_N/ (TensorBoardLogger's numbering), except a resumed one,
which continues in the directory its checkpoint came from, and a requeued SLURM job, which continues
in lightning_logs/slurm_<job id>/. Nothing an earlier run wrote is overwritten.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_only


class ResumeError(Exception):
    """The checkpoint or run directory asked for cannot be used; the message says why."""


@dataclass
class Checkpoint:
    path: Path
    run_dir: Path | None  # the run directory it was written in, if it sits in one's checkpoints/
    contents: dict


def logs_root(logger_args) -> Path:
    return Path(logger_args.save_dir) / logger_args.name if logger_args else Path("lightning_logs")


def load_checkpoint(ckpt_path: str | None, logger) -> Checkpoint | None:
    """The checkpoint `--ckpt_path` names ('last': the newest run's last.ckpt), read and checked."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        root = logs_root(logger.init_args if logger else None)
        candidates = sorted(root.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise ResumeError(f"--ckpt_path last: there is no {root}/*/checkpoints/last.ckpt to resume from")
        path = candidates[-1]
    else:
        path = Path(ckpt_path)
        if not path.is_file():
            raise ResumeError(f"checkpoint {path} does not exist")
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip, pickle and EOF errors alike: the file is not a whole checkpoint
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ResumeError(f"checkpoint {path} cannot be read; it may be truncated ({reason})") from None
    if not isinstance(contents, dict) or "state_dict" not in contents:
        raise ResumeError(f"{path} is not a Lightning checkpoint (it has no state_dict)")
    path = path.resolve()
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
    return Checkpoint(path, run_dir, contents)


def choose_run_dir(logger_args, checkpoint: Checkpoint | None) -> Path | None:
    """Point the TensorBoardLogger's arguments at the run directory; return it if it already exists."""
    if checkpoint is not None and checkpoint.run_dir is not None:
        run_dir = checkpoint.run_dir
        logger_args.save_dir, logger_args.name = str(run_dir.parent.parent), run_dir.parent.name
        logger_args.version = run_dir.name
        return run_dir
    root = logs_root(logger_args)
    if logger_args.version is None and os.environ.get("SLURM_JOB_ID"):
        # A requeued job comes back with its job id; Lightning resumes it from its hpc_ckpt_*.ckpt.
        logger_args.version = f"slurm_{os.environ['SLURM_JOB_ID']}"
        run_dir = root / logger_args.version
        return run_dir if run_dir.exists() else None
    if logger_args.version is not None:
        version = logger_args.version
        run_dir = root / (version if isinstance(version, str) else f"version_{version}")
        # Only rank 0 asks: under DDP the others may start after rank 0 has made the directory.
        if run_dir.exists() and rank_zero_only.rank == 0:
            raise ResumeError(f"{run_dir} holds an earlier run; choose another --trainer.logger.init_args.version, "
                              f"or continue that run with --ckpt_path {run_dir}/checkpoints/last.ckpt")
    return None


def free_name(folder: Path, pattern: str) -> str:
    """The first of pattern.format(1), pattern.format(2), ... that is not in `folder` yet."""
    k = 1
    while (folder / pattern.format(k)).exists():
        k += 1
    return pattern.format(k)


def check_compatible(checkpoint: Checkpoint, model: torch.nn.Module) -> None:
    """Refuse a checkpoint whose weights do not fit the model this run builds."""
    theirs, ours = checkpoint.contents["state_dict"], model.state_dict()
    if set(theirs) == set(ours) and all(theirs[k].shape == ours[k].shape for k in ours):
        return
    hp = checkpoint.contents.get("hyper_parameters", {})
    mine = model.hparams
    raise ResumeError(
        f"checkpoint {checkpoint.path} is from another model ({hp.get('arch', '?')} for "
        f"{hp.get('num_classes', '?')} classes of {tuple(hp.get('image_shape', ()))} images); this run builds "
        f"{mine.arch} for {mine.num_classes} classes of {tuple(mine.image_shape)} images")
