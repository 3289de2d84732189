"""Side by side on one machine: the tutorials' own training, this project, and a bare PyTorch loop.

    python benchmarks/speed.py --cifar10 DATA_DIR --fashion-mnist DATA_DIR            # about 15 minutes on 2 cores
    python benchmarks/speed.py --fashion-mnist DIR --only mlp --skip-tutorials --device cuda

Each DATA_DIR is a `--data.data_dir` of train.py (torchvision's layout: `cifar-10-batches-py/`, `FashionMNIST/raw/`).
For each model, each run a fresh process:
  tutorial  the tutorial's training as written (benchmarks/tutorials/)
  quick     train.py with the default recipe cut short (the CNN 2 epochs without crops; the MLP 10 epochs)
  default   train.py --model cnn / --model mlp --data fashion_mnist, nothing else changed
then, for "vs bare", --repeats rounds of short runs back to back, in turns: train.py with the default recipe, in a
pseudo-terminal with its default progress bar as at a shell, and benchmarks/bare_loop.py, the same recipe, data
batches and model in a bare PyTorch loop. It prints a markdown table and writes every figure to --work/speed.json.
Our offline machines' CIFAR-10 copy fails torchvision's md5 check: the tutorial's script needs
--cifar10-pythonpath (a sitecustomize that accepts the files as they are); train.py reads them as they are.
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


def run(cmd: list, env: dict, cwd: Path, terminal: bool = False) -> str:
    """A command's output (stdout, or what a terminal shows); the benchmark stops with its error if it fails."""
    cmd = [str(c) for c in cmd]
    log(("(in a terminal) " if terminal else "") + " ".join(cmd))
    if not terminal:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"speed.py: this run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc.stdout
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execve(cmd[0], cmd, env)
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
            output = (output + data)[-8000:]
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"speed.py: this run failed:\n{output.decode(errors='replace')[-3000:]}")
    return output.decode(errors="replace")


def tutorial(script: str, args: list, env: dict, cwd: Path) -> dict:
    out = run([sys.executable, ROOT / "benchmarks" / "tutorials" / script, *args], env, cwd)
    result = dict(re.findall(r"(\w+)=(\S+)", next(line for line in out.splitlines() if line.startswith("RESULT"))))
    return {"epochs": int(result["epochs"]), "train_s": float(result["train_s"]), "test_acc": float(result["test_acc"])}


def project(args: list, env: dict, cwd: Path, terminal: bool = False) -> dict:
    before = set((cwd / "lightning_logs").glob("version_*"))
    run([sys.executable, ROOT / "train.py", *args], env, cwd, terminal)
    (run_dir,) = set((cwd / "lightning_logs").glob("version_*")) - before
    r = json.loads((run_dir / "results.json").read_text())
    config = json.loads(json.dumps(__import__("yaml").safe_load((run_dir / "config.yaml").read_text())))
    return {"epochs": r["epochs"], "batch": config["data"]["init_args"]["batch_size"],
            "train_s": sum(r["train_epoch_seconds"]), "fit_s": r["fit_seconds"], "test_acc": r["test/acc"],
            "epoch_seconds": r["train_epoch_seconds"],
            "images_per_epoch": r["train_images_per_second"] * sum(r["train_epoch_seconds"]) / r["epochs"]}


def bare(args: list, env: dict, cwd: Path) -> dict:
    r = json.loads(run([sys.executable, ROOT / "benchmarks" / "bare_loop.py", *args], env, cwd).splitlines()[-1])
    return {"epochs": r["epochs"], "batch": r["batch_size"], "train_s": sum(r["epoch_seconds"]),
            "test_acc": r["test_acc"][-1], "epoch_seconds": r["epoch_seconds"], "epoch_acc": r["test_acc"],
            "images_per_epoch": r["images_per_second"] * sum(r["epoch_seconds"]) / r["epochs"]}


def typical(r: dict) -> float:
    """The median training epoch, the first (which warms up) left out."""
    return statistics.median(r["epoch_seconds"][1:] or r["epoch_seconds"])


def compare(args: list, env: dict, cwd: Path, runs: dict, repeats: int) -> None:
    """Rounds of short runs back to back, each taking the first place in turn: a shared machine's speed drifts by
    10-20% over minutes, more than the difference measured, so each ratio comes from neighbouring runs."""
    rounds = []
    for i in range(repeats):
        todo = {"train.py": lambda: project(args, env, cwd, terminal=True), "bare": lambda: bare(args, env, cwd)}
        order = list(todo) if i % 2 == 0 else list(reversed(todo))
        rounds.append({name: todo[name]() for name in order})
    ratios = sorted(typical(r["bare"]) / typical(r["train.py"]) for r in rounds)
    for name in ("train.py", "bare"):
        epochs = [typical(r[name]) for r in rounds]
        runs[f"{name} (short runs)"] = {**rounds[0][name], "typical_s": statistics.median(epochs),
                                        "images_per_s": rounds[0][name]["images_per_epoch"] / statistics.median(epochs)}
    runs["train.py (short runs)"].update(vs_bare=statistics.median(ratios), vs_bare_range=(ratios[0], ratios[-1]),
                                         rounds=repeats)


def table(name: str, runs: dict, target: float | None) -> str:
    tutorial_s = runs["tutorial"]["train_s"] if "tutorial" in runs else None
    lines = [f"| {name} | epochs | batch | train s | to tutorial's acc | test acc | images/s | vs bare loop |",
             "|---|---|---|---|---|---|---|---|"]
    for label, r in runs.items():
        reached = r["train_s"] if target is not None and label == "quick" and r["test_acc"] >= target else None
        if label.startswith("bare") and target is not None:
            reached = next((sum(r["epoch_seconds"][:i + 1]) for i, a in enumerate(r["epoch_acc"]) if a >= target), None)
        speedup = f" (**{tutorial_s / reached:.0f}x**)" if reached and tutorial_s else ""
        ips = r.get("images_per_s") or (r["images_per_epoch"] / typical(r) if "epoch_seconds" in r else None)
        vs = ""
        if "vs_bare" in r:
            vs = f"**{r['vs_bare']:.0%}** ({r['vs_bare_range'][0]:.0%}-{r['vs_bare_range'][1]:.0%})"
        lines.append(f"| {label} | {r['epochs']} | {r.get('batch', '')} | {r['train_s']:.1f} | "
                     f"{f'{reached:.1f} s' if reached else ''}{speedup} | {100 * r['test_acc']:.1f}% | "
                     f"{f'{ips:,.0f}' if ips else ''} | {vs} |")
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
    parser.add_argument("--cifar10-pythonpath", type=Path, help="a PYTHONPATH entry for the CIFAR-10 tutorial")
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
    work = args.work / "runs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    device = ["--trainer.accelerator=cpu"] if args.device == "cpu" else []
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the tutorials take the GPU whenever there is one
    report, record = [f"Machine: {machine(args.device)}", ""], {"machine": machine(args.device)}
    plan = {"cnn": ("CNN, CIFAR-10", "cifar10_cnn.py", [args.cifar10],
                    ["--model", "cnn", "--data.data_dir", args.cifar10],
                    ["--trainer.max_epochs=2", "--data.crop_padding=0"], 4),
            "mlp": ("MLP, Fashion-MNIST", "mnist_mlp.py", [args.fashion_mnist, "FashionMNIST"],
                    ["--model", "mlp", "--data", "fashion_mnist", "--data.data_dir", args.fashion_mnist],
                    ["--trainer.max_epochs=10"], 8)}
    for model in models:
        title, script, tutorial_args, recipe, quick, short = plan[model]
        runs = {}
        if not args.skip_tutorials:
            tutorial_env = dict(env)
            if model == "cnn" and args.cifar10_pythonpath:
                tutorial_env["PYTHONPATH"] = os.pathsep.join([str(args.cifar10_pythonpath), env["PYTHONPATH"]])
            runs["tutorial"] = tutorial(script, tutorial_args, tutorial_env, work)
        runs["quick"] = project([*recipe, *device, *quick], env, work)
        runs["default"] = project([*recipe, *device], env, work)
        runs["bare loop, default recipe"] = bare([*recipe, *device], env, work)
        compare([*recipe, *device, f"--trainer.max_epochs={short}"], env, work, runs, args.repeats)
        report += [table(title, runs, runs.get("tutorial", {}).get("test_acc")), ""]
        low, high = runs["train.py (short runs)"]["vs_bare_range"]
        report += [f"vs bare loop: the bare loop's median epoch over train.py's in each of {args.repeats} rounds of "
                   f"{short}-epoch runs back to back; the median round, and the range ({low:.0%}-{high:.0%}).", ""]
        record[model] = runs
    print("\n".join(report))
    (args.work / "speed.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
