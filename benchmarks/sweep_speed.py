"""A sweep against the same trials run one by one: 12 trials of the MLP on Fashion-MNIST, 3 epochs each.

    python benchmarks/sweep_speed.py --fashion-mnist DIR                       # CPU: --parallel (cores) workers
    python benchmarks/sweep_speed.py --fashion-mnist DIR --device cuda --per_gpu 4

DIR holds Fashion-MNIST's four IDX files, gzipped or not (t10k-images-idx3-ubyte.gz, ...), or is a data
folder that holds FashionMNIST/raw/. (On this project's machines, `apt-get install dataset-fashion-mnist`
puts them in /usr/share/datasets/fashion-mnist/.)

It times, in one invocation on one machine:
  train.py    the 12 command lines, each `python train.py ... --model.optimizer.lr=LR --seed_everything=S`, as
              separate processes one after another (what a shell loop over settings does)
  sweep.py    `python sweep.py ... --grid model.optimizer.lr=... --seeds 3`: the same 12 command lines as trials
and prints both wall times (start-up, imports and testing included) and their ratio. On a CPU a sweep gives
each of its N trials at a time cores/N threads, and float sums depend on the number of threads: the check of
each trial's val/acc_best is against a third set of runs,
  train.py T  the 12 command lines with OMP_NUM_THREADS=T, the threads of a trial (as each trial's command
              in summary.csv says), which must give exactly the sweep's val/acc_best (same seeds)
(left out on a GPU, where trials need no threads of their own). The data cache is built before anything is
timed.
"""

import argparse
import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def data_dir(source: Path, work: Path) -> Path:
    """A data folder with FashionMNIST/raw/: `source` itself, or `work`/data with the files from `source`."""
    if (source / "FashionMNIST" / "raw").is_dir():
        return source
    raw = work / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        target = raw / name
        if target.exists():
            continue
        if (source / name).is_file():
            shutil.copy(source / name, target)
        elif (source / f"{name}.gz").is_file():
            target.write_bytes(gzip.decompress((source / f"{name}.gz").read_bytes()))
        else:
            sys.exit(f"sweep_speed.py: {source} has neither {name} nor {name}.gz (see --help)")
    return work / "data"


def run(cmd: list, cwd: Path, env: dict) -> float:
    """Run `cmd`; its wall time in seconds. Exits with its stderr if it fails."""
    start = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"sweep_speed.py: this failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fashion-mnist", type=Path, required=True, help="Fashion-MNIST's IDX files (see above)")
    parser.add_argument("--work", type=Path, help="where runs are written (default: a temporary folder)")
    parser.add_argument("--lrs", default="0.005,0.01,0.015,0.03", help="the grid's learning rates")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--parallel", type=int, default=len(os.sched_getaffinity(0)),
                        help="sweep.py --parallel on a CPU (default: the cores)")
    parser.add_argument("--per_gpu", type=int, default=4, help="sweep.py --per_gpu with --device cuda")
    args = parser.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="sweep_speed_"))
    work.mkdir(parents=True, exist_ok=True)
    data = data_dir(args.fashion_mnist.resolve(), work).resolve()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    base = ["--model", "mlp", "--data", "fashion_mnist", "--data.data_dir", str(data),
            f"--trainer.max_epochs={args.epochs}", f"--trainer.accelerator={accelerator}"]
    lrs = [float(v) for v in args.lrs.split(",")]

    log("building the data cache (not timed)")
    run([sys.executable, ROOT / "train.py", *base, "--trainer.fast_dev_run=true"], work, env)

    def one_by_one(label: str, env: dict) -> tuple[float, dict]:
        log(f"{label}: {len(lrs) * args.seeds} processes, one after another")
        folder, values, seconds = work / label.replace(" ", "_").replace("=", ""), {}, 0.0
        for lr in lrs:
            for seed in range(args.seeds):
                version = f"lr{lr}_seed{seed}"
                cmd = [sys.executable, ROOT / "train.py", *base, f"--model.optimizer.lr={lr}",
                       f"--seed_everything={seed}", "--trainer.enable_progress_bar=false",
                       f"--trainer.logger.init_args.save_dir={folder}", "--trainer.logger.init_args.name=runs",
                       f"--trainer.logger.init_args.version={version}"]
                seconds += run(cmd, work, env)
                values[lr, seed] = json.loads((folder / "runs" / version / "results.json").read_text())["val/acc_best"]
                log(f"  lr {lr} seed {seed}: val/acc_best {values[lr, seed]:.4f} ({seconds:.1f} s so far)")
        return seconds, values

    seq_seconds, separate = one_by_one("train.py", env)
    threads = max(1, len(os.sched_getaffinity(0)) // args.parallel)
    if args.device == "cpu":
        matched_seconds, matched = one_by_one(f"train.py OMP_NUM_THREADS={threads}",
                                              {**env, "OMP_NUM_THREADS": str(threads)})

    workers = ["--per_gpu", args.per_gpu] if args.device == "cuda" else ["--parallel", args.parallel]
    name = f"speed-{time.strftime('%Y%m%d-%H%M%S')}"
    log(f"sweep.py: the same {len(lrs) * args.seeds} trials ({' '.join(map(str, workers))})")
    cmd = [sys.executable, ROOT / "sweep.py", *base, "--grid", f"model.optimizer.lr={args.lrs}",
           "--seeds", args.seeds, *workers, "--name", name]
    sweep_seconds = run(cmd, work, env)
    rows = list(csv.DictReader(open(work / "lightning_logs" / "sweeps" / name / "summary.csv")))
    swept = {(float(r["model.optimizer.lr"]), int(r["seed"])): float(r["val/acc_best"]) for r in rows}

    print(f"\n{len(lrs) * args.seeds} trials of the MLP on Fashion-MNIST, {args.epochs} epochs each, on {args.device} "
          f"({len(os.sched_getaffinity(0))} cores)\n")
    reference = matched if args.device == "cpu" else separate
    label = f"train.py, {threads} thread{'s' if threads > 1 else ''}" if args.device == "cpu" else "train.py"
    print(f"| lr | seed | val/acc_best, train.py | val/acc_best, {label} | val/acc_best, sweep.py |")
    print("|---|---|---|---|---|")
    same = True
    for (lr, seed), value in sorted(separate.items()):
        ref, other = reference[lr, seed], swept.get((lr, seed))
        same &= other == ref
        print(f"| {lr} | {seed} | {value:.4f} | {ref:.4f} | {other:.4f}{'' if other == ref else ' (differs)'} |")
    print(f"\n| {len(separate)} trials | wall s |\n|---|---|\n| train.py, one after another | {seq_seconds:.1f} |")
    if args.device == "cpu":
        print(f"| train.py with OMP_NUM_THREADS={threads}, one after another | {matched_seconds:.1f} |")
    print(f"| sweep.py {' '.join(map(str, workers))} | {sweep_seconds:.1f} |\n")
    print(f"sweep.py took {sweep_seconds / seq_seconds:.2f} of the time of separate train.py runs "
          f"({seq_seconds / sweep_seconds:.1f}x faster); each trial's val/acc_best is "
          f"{'identical to' if same else 'NOT identical to'} its {label} run's.")
    print(f"Runs in {work}")


if __name__ == "__main__":
    main()
