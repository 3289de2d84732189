"""Side by side on one machine: the tutorials' own training, this project's recipes, and a bare
PyTorch loop.

    # about 40 minutes on 2 cores
    python benchmarks/speed.py --cifar10 DATA_DIR --fashion-mnist DATA_DIR
    python benchmarks/speed.py --fashion-mnist DIR --only mlp --repeats 1 --device cuda

Each DATA_DIR is a `--data.data_dir` of train.py (torchvision's layout: `cifar-10-batches-py/`,
`FashionMNIST/raw/`). For each model, --repeats times each (seeds 0, 1, ...), each run a fresh
process:
  tutorial  the tutorial's training as written (benchmarks/tutorials/)
  quick     train.py --model quick_cnn / quick_mlp: the recipe chosen to reach the tutorial's
            accuracy fastest
  default   train.py --model cnn / --model mlp --data FashionMNISTDataModule: the recipe that
            ends highest
with the median and range of their training time and test accuracy, and the tutorial's time over
the quick recipe's. Then, for "vs bare loop", --rounds rounds of short runs back to back, in turns:
train.py with the default recipe, in a pseudo-terminal with its default progress bar as at a shell,
and benchmarks/bare_loop.py, the same recipe, batches and model in a bare PyTorch loop. It prints
markdown tables and writes every run to --work/speed.json. Our offline machines' CIFAR-10 copy fails
torchvision's md5 check: the tutorial's script needs --cifar10-pythonpath (a sitecustomize that
accepts the files as they are); train.py reads them as they are.
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
    """A command's output (stdout, or what a terminal shows); the benchmark stops with its error if
    it fails."""
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
    result = dict(re.findall(r"(\w+)=(\S+)",
                             next(line for line in out.splitlines() if line.startswith("RESULT"))))
    return {"epochs": int(result["epochs"]), "batch": 4 if "cnn" in script else 64,
            "train_s": float(result["train_s"]), "test_acc": float(result["test_acc"])}


def project(args: list, env: dict, cwd: Path, terminal: bool = False) -> dict:
    before = set((cwd / "lightning_logs").glob("version_*"))
    run([sys.executable, ROOT / "train.py", *args], env, cwd, terminal)
    (run_dir,) = set((cwd / "lightning_logs").glob("version_*")) - before
    r = json.loads((run_dir / "results.json").read_text())
    config = json.loads(json.dumps(
        __import__("yaml").safe_load((run_dir / "config.yaml").read_text())))
    seconds = epoch_scalars(run_dir, "train/epoch_seconds")
    speed = epoch_scalars(run_dir, "train/images_per_second")
    return {"epochs": r["epochs"], "batch": config["data"]["init_args"]["batch_size"],
            "train_s": sum(seconds), "fit_s": r["fit_seconds"],
            "test_acc": r["metrics"]["test/acc"], "epoch_seconds": seconds,
            "images_per_epoch": statistics.mean(s * t for s, t in zip(speed, seconds))}


def epoch_scalars(run_dir: Path, tag: str) -> list[float]:
    """A scalar's values in a run's TensorBoard events, in step order (TrainingSpeed logs one an
    epoch)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [e.value for e in sorted(events.Scalars(tag), key=lambda e: e.step)]


def bare(args: list, env: dict, cwd: Path) -> dict:
    r = json.loads(run([sys.executable, ROOT / "benchmarks" / "bare_loop.py", *args],
                       env, cwd).splitlines()[-1])
    return {"epochs": r["epochs"], "batch": r["batch_size"], "train_s": sum(r["epoch_seconds"]),
            "test_acc": r["test_acc"][-1], "epoch_seconds": r["epoch_seconds"],
            "epoch_acc": r["test_acc"],
            "images_per_epoch": r["images_per_second"] * sum(r["epoch_seconds"]) / r["epochs"]}


def typical(r: dict) -> float:
    """The median training epoch, the first (which warms up) left out."""
    return statistics.median(r["epoch_seconds"][1:] or r["epoch_seconds"])


def compare(args: list, env: dict, cwd: Path, rounds: int) -> list[dict]:
    """Rounds of short runs back to back, each taking the first place in turn: a shared machine's
    speed drifts by 10-20% over minutes, more than the difference measured, so each ratio comes from
    neighbouring runs."""
    done = []
    for i in range(rounds):
        todo = {"train.py": lambda: project(args, env, cwd, terminal=True),
                "bare": lambda: bare(args, env, cwd)}
        done.append({name: todo[name]()
                     for name in (list(todo) if i % 2 == 0 else list(reversed(todo)))})
    return done


def spread(values: list[float], fmt: str) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})" if len(values) > 1 else f"{mid:{fmt}}"


def table(name: str, runs: dict) -> str:
    """Rows: the tutorial, the quick and default recipes (median and range of their repeats), the
    vs-bare rounds."""
    tutorial_s = (statistics.median(r["train_s"] for r in runs["tutorial"])
                  if runs.get("tutorial") else None)
    lines = [f"| {name} | epochs | batch | train s | fit s | test acc | vs tutorial's time (fit) |",
             "|---|---|---|---|---|---|---|"]
    for label in ("tutorial", "quick", "default"):
        repeats = runs.get(label)
        if not repeats:
            continue
        seconds, fits = ([r["train_s"] for r in repeats],
                         [r.get("fit_s", r["train_s"]) for r in repeats])
        faster = ""
        if tutorial_s and label != "tutorial":
            # the whole fit a user waits (data, statistics, checkpoints too),
            # against the tutorial's run of the same seed, next to it
            ratios = [t["train_s"] / fit for t, fit in zip(runs["tutorial"], fits)]
            faster = (f"**{statistics.median(ratios):.0f}x** faster "
                      f"({min(ratios):.0f}x-{max(ratios):.0f}x)")
        lines.append(f"| {label} | {repeats[0]['epochs']} | {repeats[0].get('batch', '')} "
                     f"| {spread(seconds, '.1f')} | "
                     f"{spread(fits, '.1f') if label != 'tutorial' else ''} | "
                     f"{spread([100 * r['test_acc'] for r in repeats], '.1f')}% | {faster} |")
    rounds = runs["rounds"]
    ratios = [typical(r["bare"]) / typical(r["train.py"]) for r in rounds]
    ips = {k: [r[k]["images_per_epoch"] / typical(r[k]) for r in rounds]
           for k in ("train.py", "bare")}
    lines += ["",
              f"| default recipe, {len(rounds)} rounds of {rounds[0]['bare']['epochs']}-epoch runs "
              f"back to back | images/s (median epoch) | train.py vs bare loop |",
              "|---|---|---|",
              f"| train.py (progress bar on) | {spread(ips['train.py'], ',.0f')} "
              f"| **{spread(ratios, '.0%')}** |",
              f"| bare PyTorch loop | {spread(ips['bare'], ',.0f')} | |"]
    return "\n".join(lines)


def machine(device: str) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    where = torch.cuda.get_device_name() if device == "cuda" else f"{cpu}, {os.cpu_count()} cores"
    return f"{where}; torch {torch.__version__}, Python {platform.python_version()}"


def parse() -> tuple[argparse.Namespace, list[str]]:
    """The command line's options (their folders resolved), and the models to run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cifar10", type=Path, help="data_dir holding cifar-10-batches-py/")
    parser.add_argument("--fashion-mnist", type=Path, help="data_dir holding FashionMNIST/raw/")
    parser.add_argument("--cifar10-pythonpath", type=Path,
                        help="a PYTHONPATH entry for the CIFAR-10 tutorial")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lit-bench"),
                        help="run logs and speed.json")
    parser.add_argument("--only", choices=["cnn", "mlp"])
    parser.add_argument("--skip-tutorials", action="store_true",
                        help="leave out the (slow) tutorial scripts")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each recipe and tutorial (seeds 0, 1, ...)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="rounds of short back-to-back runs, for vs bare")
    args = parser.parse_args()
    for name in ("cifar10", "fashion_mnist", "cifar10_pythonpath"):  # the runs start in --work
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    models = [args.only] if args.only else ["cnn", "mlp"]
    for model, folder in (("cnn", args.cifar10), ("mlp", args.fashion_mnist)):
        if model in models and folder is None:
            parser.error(f"--{'cifar10' if model == 'cnn' else 'fashion-mnist'} DATA_DIR "
                         f"is needed for the {model}")
    return args, models


def main() -> None:
    args, models = parse()
    work = args.work / "runs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    device = ["--trainer.accelerator=cpu"] if args.device == "cpu" else []
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the tutorials take the GPU whenever there is one
    report, record = [f"Machine: {machine(args.device)}", ""], {"machine": machine(args.device)}
    plan = {"cnn": ("CNN, CIFAR-10", "cifar10_cnn.py", [args.cifar10],
                    ["--data.data_dir", args.cifar10], 4),
            "mlp": ("MLP, Fashion-MNIST", "mnist_mlp.py", [args.fashion_mnist, "FashionMNIST"],
                    ["--data", "FashionMNISTDataModule", "--data.data_dir", args.fashion_mnist], 8)}
    for model in models:
        title, script, tutorial_args, data, short = plan[model]
        runs = {"tutorial": [], "quick": [], "default": []}
        tutorial_env = dict(env)
        if model == "cnn" and args.cifar10_pythonpath:
            tutorial_env["PYTHONPATH"] = os.pathsep.join([str(args.cifar10_pythonpath),
                                                          env["PYTHONPATH"]])
        for seed in range(args.repeats):
            if not args.skip_tutorials:
                runs["tutorial"].append(tutorial(script, [*tutorial_args, "--seed", seed],
                                                 tutorial_env, work))
            for label, recipe in (("quick", f"quick_{model}"), ("default", model)):
                runs[label].append(project(["--model", recipe, *data, *device,
                                            f"--seed_everything={seed}"], env, work))
        runs["rounds"] = compare(["--model", model, *data, *device,
                                  f"--trainer.max_epochs={short}"], env, work, args.rounds)
        report += [table(title, runs), ""]
        record[model] = runs
    print("\n".join(report))
    (args.work / "speed.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
