"""Running the CLI as a user does, and reading back what a run wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import write_mnist
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "train.py")
# Small and quick everywhere: no progress bar, no model summary, few validation images.
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def run_inprocess(args: list[str], monkeypatch=None, quiet: bool = True) -> int:
    """`python train.py ARGS` in this process (so fixtures' monkeypatches apply); returns the exit code.
    `quiet` adds QUIET (no progress bar, no model summary)."""
    import logging

    import train

    # Lightning's log handlers keep the stderr of the test that imported it first, closed since: this one's
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.stream = sys.stderr  # not setStream: it flushes the old one
    argv_before = sys.argv
    sys.argv = ["train.py"]  # LightningCLI warns when both sys.argv and args carry arguments
    try:
        return train.main(args + (QUIET if quiet else []))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv_before


def run_subprocess(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 240, quiet: bool = True):
    """`python train.py ARGS` in a fresh interpreter, in `cwd` (with QUIET unless `quiet` is false)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, TRAIN, *args, *(QUIET if quiet else [])], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_in_terminal(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 240) -> tuple[int, str]:
    """`python train.py ARGS` with a terminal (a pseudo-terminal, 150 columns) as its stdout and stderr, as a user
    at a shell runs it: progress bars and all. Returns the exit code and what the terminal received."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes train.py
        os.chdir(cwd)
        os.environ.update({"PYTHONPATH": str(ROOT), **(env or {})})
        os.execv(sys.executable, [sys.executable, TRAIN, *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
    output, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            output += data
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


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


def finished_mnist_run(cwd: Path, args: list[str]):
    """A run of `args` trained to its end in `cwd` on MNIST IDX files written to `cwd/data`, for a module's tests:
    its folder, data and run directory (`lightning_logs/mlp-mnist/version_0`)."""
    data = write_mnist(cwd / "data")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        assert run_inprocess([*args, "--data.data_dir", str(data)]) == 0
    return SimpleNamespace(cwd=cwd, data=data, run=cwd / "lightning_logs" / "mlp-mnist" / "version_0")
