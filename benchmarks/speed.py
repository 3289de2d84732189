"""Side by side on one machine: the tutorials' own training, this project, and a bare PyTorch loop.

    python benchmarks/speed.py --cifar10 DATA_DIR --fashion-mnist DATA_DIR     # CPU; about 15 minutes on 2 cores
    python benchmarks/speed.py --cifar10 DIR --fashion-mnist DIR --device cuda  # on a GPU
    python benchmarks/speed.py --fashion-mnist DIR --only mlp --skip-tutorials

Each DATA_DIR is a `--data.data_dir` of train.py (torchvision's layout: `cifar-10-batches-py/`,
`FashionMNIST/raw/`; torchvision downloads the data there where there is a network). For each model it
runs, each in a fresh process:
  tutorial  the tutorial's training as written (benchmarks/tutorials/)
  quick     train.py with the default recipe cut short (the CNN without crops, 2 epochs; the MLP 10)
  default   train.py --model cnn / --model mlp --data fashion_mnist, nothing else changed
  bare      benchmarks/bare_loop.py: the default recipe in a bare loop over the same device batches
then, for "vs bare", --repeats rounds of short runs back to back: train.py with one optimizer step per
Lightning step (--data.steps_per_call 1), train.py as it comes (the default steps_per_call), and the
bare loop, so that all three see the same machine. train.py runs in a pseudo-terminal, with its progress
bars, as a user at a shell runs it. It prints a markdown table and writes it with every figure to
`--work/speed.json`. docs/benchmarks.md explains the method.

Our offline machines have no network for torchvision's downloads: their CIFAR-10 is a JPEG re-encoding
whose pickles fail torchvision's md5 check, and the runs that read it are given a PYTHONPATH entry
with `--cifar10-pythonpath DIR` (a sitecustomize that accepts the files as they are).
"""

import argparse
import fcntl
import json
import os
import platform
import pty
import re
import select
import shutil
import statistics
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list, env: dict, cwd: Path) -> str:
    """A command's stdout; the benchmark stops with its error if it fails."""
    log(" ".join(str(c) for c in cmd))
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"speed.py: this run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def run_in_terminal(cmd: list, env: dict, cwd: Path) -> None:
    """A command with a pseudo-terminal as its output, as a user at a shell runs it (progress bars drawn)."""
    log("(in a terminal) " + " ".join(str(c) for c in cmd))
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, *map(str, cmd[1:])], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))
    output = b""
    while True:
        if select.select([fd], [], [], 1)[0]:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            output += data[-4000:]
            output = output[-8000:]
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"speed.py: this run failed:\n{output.decode(errors='replace')[-3000:]}")


def tutorial_run(script: str, args: list, env: dict, cwd: Path) -> dict:
    out = run([sys.executable, ROOT / "benchmarks" / "tutorials" / script, *args], env, cwd)
    result = dict(re.findall(r"(\w+)=(\S+)", next(line for line in out.splitlines() if line.startswith("RESULT"))))
    return {"epochs": int(result["epochs"]), "train_s": float(result["train_s"]),
            "test_acc": float(result["test_acc"])}


def project_run(args: list, env: dict, cwd: Path, terminal: bool = False) -> dict:
    before = set((cwd / "lightning_logs").glob("*/version_*"))
    cmd = [sys.executable, ROOT / "train.py", *args]
    if terminal:
        run_in_terminal(cmd, env, cwd)
    else:
        run(cmd, env, cwd)
    (run_dir,) = set((cwd / "lightning_logs").glob("*/version_*")) - before
    res = json.loads((run_dir / "results.json").read_text())
    return {"epochs": res["epochs"], "batch": res["batch_size"], "train_s": res["train_seconds"],
            "fit_s": res["fit_seconds"], "test_acc": res["test/acc"], "epoch_seconds": res["train_epoch_seconds"],
            "steps_per_call": res["steps_per_call"],
            "images_per_epoch": res["train_images_per_second"] * res["train_seconds"] / res["epochs"]}


def bare_run(args: list, env: dict, cwd: Path) -> dict:
    res = json.loads(run([sys.executable, ROOT / "benchmarks" / "bare_loop.py", *args], env, cwd))
    return {"epochs": res["epochs"], "batch": res["batch_size"], "train_s": sum(res["epoch_seconds"]),
            "test_acc": res["test_acc"][-1], "epoch_seconds": res["epoch_seconds"], "epoch_acc": res["test_acc"],
            "images_per_epoch": res["images_per_second"] * sum(res["epoch_seconds"]) / res["epochs"]}


def typical_epoch(r: dict) -> float:
    """The median training epoch, the first (which warms up) left out."""
    return statistics.median(r["epoch_seconds"][1:] or r["epoch_seconds"])


def compare(project: tuple, bare: tuple, runs: dict, repeats: int) -> None:
    """Rounds of short runs back to back: train.py with one step per call, train.py as it comes, the bare loop.

    A shared VM's speed drifts by 10-20% over minutes, more than the difference being measured: each round
    sees nearly the same machine, so "vs bare" is the median over rounds of the ratio of median epochs, and
    its range is printed under the table.
    """
    args, env, cwd = project
    rounds = []
    for i in range(repeats):
        todo = [lambda: project_run([*args, "--data.steps_per_call=1"], env, cwd, terminal=True),
                lambda: project_run(args, env, cwd, terminal=True), lambda: bare_run(*bare)]
        order = [(i + k) % 3 for k in range(3)]  # each takes each place in turn: no place is always the slow one
        done = {k: todo[k]() for k in order}
        rounds.append((done[0], done[1], done[2]))
    for label, i in (("steps_per_call=1", 0), ("default", 1)):
        ratios = sorted(typical_epoch(r[2]) / typical_epoch(r[i]) for r in rounds)
        runs.setdefault(label, {**rounds[0][i], "label": label})
        runs[label].update(vs_bare=statistics.median(ratios), vs_bare_range=(ratios[0], ratios[-1]),
                           typical_epoch_s=statistics.median(typical_epoch(r[i]) for r in rounds))
    runs["bare"]["typical_epoch_s"] = statistics.median(typical_epoch(r[2]) for r in rounds)
    runs["rounds"] = repeats


def table(name: str, runs: dict, target: float | None) -> str:
    tutorial_s = runs["tutorial"]["train_s"] if "tutorial" in runs else None
    lines = [f"| {name} | epochs | batch | train s | fit s | to tutorial acc | vs tutorial | test acc | images/s "
             f"| vs bare |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in runs.items():
        if not isinstance(r, dict):
            continue
        if "epoch_seconds" in r:
            r["images_per_s"] = r["images_per_epoch"] / r.get("typical_epoch_s", typical_epoch(r))
        reached = None
        if target is not None and label == "bare":  # per-epoch test accuracy is known
            reached = next((sum(r["epoch_seconds"][:i + 1]) for i, acc in enumerate(r["epoch_acc"]) if acc >= target),
                           None)
        elif target is not None and label == "quick" and r["test_acc"] >= target:
            reached = r["train_s"]
        reach = f"{reached:.1f} s" if reached else ""
        speedup = f"**{tutorial_s / reached:.0f}x**" if reached and tutorial_s else ""
        ips = f"{r['images_per_s']:,.0f}" if r.get("images_per_s") else ""
        vs_bare = f"{r['vs_bare']:.0%}" if "vs_bare" in r else ""
        fit = f"{r['fit_s']:.1f}" if "fit_s" in r else ""
        shown = {"default": "default (train.py)", "steps_per_call=1": "train.py, --data.steps_per_call 1"}.get(label,
                                                                                                             label)
        lines.append(f"| {shown} | {r['epochs']} | {r.get('batch', '')} | {r['train_s']:.1f} | {fit} | {reach} | "
                     f"{speedup} | {100 * r['test_acc']:.1f}% | {ips} | {vs_bare} |")
    for label in ("default", "steps_per_call=1"):
        if "vs_bare_range" in runs.get(label, {}):
            low, high = runs[label]["vs_bare_range"]
            lines.append(f"\nvs bare ({label}): median of {runs['rounds']} rounds of back-to-back runs; range "
                         f"{low:.0%} to {high:.0%}.")
    return "\n".join(lines)


def machine(device: str) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    where = torch.cuda.get_device_name() if device == "cuda" else f"{cpu}, {os.cpu_count()} cores"
    return f"{where}; torch {torch.__version__}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cifar10", type=Path, help="data_dir holding cifar-10-batches-py/")
    parser.add_argument("--fashion-mnist", type=Path, help="data_dir holding FashionMNIST/raw/")
    parser.add_argument("--cifar10-pythonpath", type=Path, help="a PYTHONPATH entry for the runs that read CIFAR-10")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lit-bench"), help="run logs and speed.json")
    parser.add_argument("--only", choices=["cnn", "mlp"])
    parser.add_argument("--skip-tutorials", action="store_true", help="leave out the (slow) tutorial scripts")
    parser.add_argument("--repeats", type=int, default=6, help="rounds of short back-to-back runs, for vs bare")
    args = parser.parse_args()
    models = [args.only] if args.only else ["cnn", "mlp"]
    for model, folder in (("cnn", args.cifar10), ("mlp", args.fashion_mnist)):
        if model in models and folder is None:
            parser.error(f"--{'cifar10' if model == 'cnn' else 'fashion-mnist'} DATA_DIR is needed for the {model}")

    runs_dir = args.work / "runs"
    shutil.rmtree(runs_dir, ignore_errors=True)
    runs_dir.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    accelerator = []
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the tutorials pick the GPU whenever there is one
        accelerator = ["--trainer.accelerator=cpu"]
    cifar_env = dict(env)
    if args.cifar10_pythonpath:
        cifar_env["PYTHONPATH"] = os.pathsep.join([str(args.cifar10_pythonpath), env["PYTHONPATH"]])
    report, record = [f"Machine: {machine(args.device)}", ""], {"machine": machine(args.device)}

    if "cnn" in models:
        runs = {}
        if not args.skip_tutorials:
            runs["tutorial"] = tutorial_run("cifar10_cnn.py", [args.cifar10], cifar_env, runs_dir)
        common = ["--data.data_dir", args.cifar10, *accelerator]
        runs["quick"] = project_run(["--model", "cnn", "--trainer.max_epochs=2", "--data.crop_padding=0", *common],
                                    cifar_env, runs_dir)
        runs["default"] = project_run(["--model", "cnn", *common], cifar_env, runs_dir)
        bare = ["--config", ROOT / "configs" / "cnn.yaml", "--data.data_dir", args.cifar10, "--device", args.device]
        runs["bare"] = bare_run(bare, cifar_env, runs_dir)
        compare((["--model", "cnn", "--trainer.max_epochs=4", *common], cifar_env, runs_dir),
                ([*bare, "--epochs=4"], cifar_env, runs_dir), runs, args.repeats)
        report += [table("CNN, CIFAR-10", runs, runs.get("tutorial", {}).get("test_acc")), ""]
        record["cnn"] = runs

    if "mlp" in models:
        runs = {}
        if not args.skip_tutorials:
            runs["tutorial"] = tutorial_run("mnist_mlp.py", [args.fashion_mnist, "FashionMNIST"], env, runs_dir)
        common = ["--data", "fashion_mnist", "--data.data_dir", args.fashion_mnist, *accelerator]
        runs["quick"] = project_run(["--model", "mlp", "--trainer.max_epochs=10", *common], env, runs_dir)
        runs["default"] = project_run(["--model", "mlp", *common], env, runs_dir)
        bare = ["--config", ROOT / "configs" / "mlp.yaml", "--data", "fashion_mnist", "--data.data_dir",
                args.fashion_mnist, "--device", args.device]
        runs["bare"] = bare_run(bare, env, runs_dir)
        compare((["--model", "mlp", "--trainer.max_epochs=8", *common], env, runs_dir),
                ([*bare, "--epochs=8"], env, runs_dir), runs, args.repeats)
        report += [table("MLP, Fashion-MNIST", runs, runs.get("tutorial", {}).get("test_acc")), ""]
        record["mlp"] = runs

    print("\n".join(report))
    (args.work / "speed.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
