"""Running the CLI as a user does, and reading back what a run wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "train.py")
# Small and quick everywhere: no progress bar, no model summary, few validation images.
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def run_inprocess(args: list[str], monkeypatch=None) -> int:
    """`python train.py ARGS` in this process (so fixtures' monkeypatches apply); returns the exit code."""
    import train

    argv_before = sys.argv
    sys.argv = ["train.py"]  # LightningCLI warns when both sys.argv and args carry arguments
    try:
        return train.main(args + QUIET)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv_before


def run_subprocess(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 240):
    """`python train.py ARGS` in a fresh interpreter, in `cwd`."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, TRAIN, *args, *QUIET], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_dirs(cwd: Path) -> list[Path]:
    """The run directories under cwd/lightning_logs/<model>-<data>/, oldest first."""
    logs = cwd / "lightning_logs"
    return sorted(logs.glob("*/version_*"), key=lambda p: p.stat().st_ctime_ns) if logs.is_dir() else []


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar tag in the run's TensorBoard event files, with its values in step order."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
