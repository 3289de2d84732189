"""Fixtures that write tiny data sets in the real on-disk formats, read back by the real torchvision
classes.

The images are learnable: each class is a bright square at its own position over noise, so a few
epochs of either network separate them, and a test can assert accuracy well above chance.
"""

import gzip
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

# One thread of torch per process: two pytest workers share two cores, and each process's pool
# of two threads spun against the other's. Set before any test module imports torch, and
# inherited by the processes the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CIFAR_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]


def class_images(n: int, channels: int, size: int, num_classes: int = 10, seed: int = 0):
    """n uint8 images (n, size, size, channels) with labels: class k is a bright square at
    position k."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % num_classes
    rng.shuffle(labels)
    images = rng.integers(0, 90, size=(n, size, size, channels), dtype=np.uint8)
    cell = size // 4
    for i, k in enumerate(labels):
        r, c = divmod(int(k), 4)
        images[i, r * cell : (r + 1) * cell, c * cell : (c + 1) * cell, :] = 230
    return images, labels.astype(np.int64)


def write_cifar10(root: Path, per_batch: int = 100, test: int = 200) -> Path:
    """CIFAR-10's python pickle layout: data_batch_1..5, test_batch, batches.meta."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def dump(name, images, labels):
        rows = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # R, G, B planes per row
        with open(folder / name, "wb") as f:
            pickle.dump(
                {
                    "batch_label": name,
                    "labels": labels.tolist(),
                    "data": rows,
                    "filenames": [f"{name}_{i}.png" for i in range(len(images))],
                },
                f,
            )

    images, labels = class_images(5 * per_batch + test, 3, 32)
    for b in range(5):
        part = slice(b * per_batch, (b + 1) * per_batch)
        dump(f"data_batch_{b + 1}", images[part], labels[part])
    dump("test_batch", images[5 * per_batch :], labels[5 * per_batch :])
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump(
            {"label_names": CIFAR_CLASSES, "num_cases_per_batch": per_batch, "num_vis": 3072}, f
        )
    return root


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """An IDX file as MNIST ships it: magic (0, 0, type 0x08 = uint8, ndim), big-endian dims,
    data."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


def write_mnist(
    root: Path, folder: str = "MNIST", train: int = 600, test: int = 200, compress: bool = False
) -> Path:
    """MNIST's (and Fashion-MNIST's) IDX layout under root/<folder>/raw/."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    images, labels = class_images(train + test, 1, 28, seed=1)
    images = images[..., 0]
    write_idx(raw / "train-images-idx3-ubyte", images[:train], compress)
    write_idx(raw / "train-labels-idx1-ubyte", labels[:train], compress)
    write_idx(raw / "t10k-images-idx3-ubyte", images[train:], compress)
    write_idx(raw / "t10k-labels-idx1-ubyte", labels[train:], compress)
    return root


@pytest.fixture
def cifar10_dir(tmp_path) -> Path:
    return write_cifar10(tmp_path / "data")


@pytest.fixture
def mnist_dir(tmp_path) -> Path:
    return write_mnist(tmp_path / "data")


@pytest.fixture
def fashion_mnist_dir(tmp_path) -> Path:
    return write_mnist(tmp_path / "data", folder="FashionMNIST")


@pytest.fixture
def own_modules(tmp_path, monkeypatch) -> Path:
    """tmp_path on sys.path, as PYTHONPATH puts a user's folder for a process: the modules a test
    writes there import, and are forgotten after it (another test's module of that name is its
    own)."""
    before = set(sys.modules)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None)).startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in an empty directory, so lightning_logs/ lands there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# The modules whose tests start sweeps, servers and nodes, and take longest, each group at the front
# of one half of the run: pytest-xdist's worksteal (pyproject.toml) gives each of the two workers a
# half, and an idle worker takes tests from the end of the busy one's queue. With them all at the
# front, one worker ran them while the other ran the rest, and then waited 90 s for it.
FIRST_HALF = ("test_sweep.py",)
SECOND_HALF = ("test_postgres.py", "test_multinode.py", "test_ddp.py")


def pytest_collection_modifyitems(items):
    first = [item for item in items if item.path.name in FIRST_HALF]
    second = [item for item in items if item.path.name in SECOND_HALF]
    rest = [item for item in items if item.path.name not in FIRST_HALF + SECOND_HALF]
    cut = max(0, len(items) // 2 - len(first))
    items[:] = first + rest[:cut] + second + rest[cut:]


# --- running train.py as a user does
# ---------------------------------------------------------------------------

TRAIN, SWEEP = str(ROOT / "train.py"), str(ROOT / "sweep.py")
# A process's environment where its command line names probes.* callbacks (tests/probes.py).
PROBES = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
# Small and quick: no progress bar or model summary (the terminal tests keep the defaults).
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def run_train(args: list[str], quiet: bool = True) -> int:
    """`python train.py ARGS` in this process (monkeypatches apply); its exit code."""
    import train

    log_to_this_tests_stderr()
    return train.main([*args, *(QUIET if quiet else [])])


def log_to_this_tests_stderr() -> None:
    """Lightning's log handlers keep the stderr of the test that first imported it, closed since:
    this one's."""
    import logging

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.stream = sys.stderr


def run_sweep(args: list[str]) -> int:
    """`python sweep.py ARGS` in this process (monkeypatches apply); its exit code. Its first
    worker is this process, its others are processes. The signal handlers are set back however
    it ends (an error that ends it leaves its workers' handler)."""
    import signal

    import sweep

    log_to_this_tests_stderr()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return sweep.main(args)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def sweep_here(args: list[str], cwd: Path, capfd) -> tuple[int, str]:
    """`python sweep.py ARGS` in `cwd`, run in this process (run_sweep): its exit code and what it
    and its workers wrote to stderr."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        code = run_sweep(args)
    return code, capfd.readouterr().err


def run_process(
    args: list[str],
    cwd: Path,
    script: str = TRAIN,
    env: dict | None = None,
    timeout: int = 240,
    quiet: bool = True,
) -> subprocess.CompletedProcess:
    """`python train.py ARGS` (or sweep.py) in a fresh interpreter in `cwd`."""
    return subprocess.run(
        [sys.executable, script, *args, *(QUIET if quiet else [])],
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
    )


def run_in_terminal(
    args: list[str], cwd: Path, script: str = TRAIN, timeout: int = 240, env: dict | None = None
) -> tuple[int, str]:
    """`python train.py ARGS` with a pseudo-terminal (150 columns) as its stdout and stderr, as
    at a shell: progress bars and all. The exit code and what the terminal received."""
    import fcntl
    import pty
    import select
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.environ.update({"PYTHONPATH": str(ROOT), **(env or {})})
        os.execv(sys.executable, [sys.executable, script, *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
    output, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            output += data
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def runs(cwd: Path) -> list[Path]:
    """The run directories under cwd/lightning_logs, oldest first."""
    return sorted(
        (cwd / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1])
    )


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def scalars(run: Path) -> dict[str, list[float]]:
    """Every scalar tag in a run's TensorBoard events, its values in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [e.value for e in sorted(events.Scalars(tag), key=lambda e: e.step)]
        for tag in events.Tags()["scalars"]
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished MLP run on MNIST IDX files, shared by a module's tests: its folder and run
    directory."""
    cwd = tmp_path_factory.mktemp("trained")
    data = write_mnist(cwd / "data")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        assert (
            run_train(
                [
                    "--model",
                    "mlp",
                    "--data.data_dir",
                    str(data),
                    "--trainer.max_epochs",
                    "3",
                    "--data.batch_size",
                    "64",
                ]
            )
            == 0
        )
    return SimpleNamespace(cwd=cwd, data=data, run=cwd / "lightning_logs" / "version_0")
