"""Side by side on one machine: the tutorials' own scripts, this project, and a bare PyTorch loop.

    python benchmarks/speed.py                  # CPU; about 11 minutes on 2 cores
    python benchmarks/speed.py --device cuda    # on a GPU
    python benchmarks/speed.py --only mlp --skip-seeds

For each model it runs, each in a fresh process, on the real data of ../shared/datasets/:
  seed     the tutorial's script as written (../shared/baselines/seed_*.py)
  quick    train.py with the default recipe cut short (the CNN without crops, 2 epochs; the MLP 8)
  default  train.py --model cnn / --model mlp --data fashion_mnist, nothing else changed
  bare     benchmarks/bare_loop.py: the default recipe in a bare loop over the same device batches
and prints a markdown table.

- "train s" is training time alone, as the seeds measure theirs: for train.py the training batches
  of every epoch (validation, checkpointing and start-up excluded); "fit s" is train.py's whole fit.
- "to seed acc" is the training time until the test accuracy first reached the seed's: train.py's
  whole run (it tests once, at the end), the bare loop's epochs up to the first that reached it.
- "images/s" is training images per second in the median epoch (first epochs left out); for
  default and bare, of --repeats pairs of short runs, train.py then the bare loop, so that both see
  the same machine (a shared 2-core VM drifts by 20% over minutes). "vs bare" is train.py's
  throughput over the bare loop's at the same recipe and batch size: the median over the pairs.

The CIFAR-10 archive is JPEG-re-encoded, so torchvision's md5 check of the pickle batches written from
it cannot pass: the CIFAR-10 runs get ../shared/datasets/offline_cifar10 on PYTHONPATH, as that
folder's README describes. It changes nothing else.
"""

import argparse
import gzip
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prepare_data(shared: Path, fashion_gz: Path, work: Path) -> dict[str, Path]:
    """CIFAR-10 as the seed's .npz and as torchvision's pickle batches; Fashion-MNIST's IDX files."""
    paths = {"npz": work / "cifar10.npz", "cifar10": work / "cifar10", "fashion": work / "fashion"}
    if not paths["npz"].exists() or not (paths["cifar10"] / "cifar-10-batches-py").exists():
        log("decoding the CIFAR-10 JPEG archive")
        spec = importlib.util.spec_from_file_location("cifar10_jpeg", shared / "datasets" / "cifar10_jpeg.py")
        cifar10_jpeg = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cifar10_jpeg)
        np.savez(paths["npz"], **cifar10_jpeg.load())
        cifar10_jpeg.write_torchvision_layout(paths["cifar10"])
    raw = paths["fashion"] / "FashionMNIST" / "raw"
    if not raw.is_dir():
        sources = sorted(fashion_gz.glob("*-ubyte.gz"))
        if len(sources) != 4:
            sys.exit(f"speed.py: Fashion-MNIST's four *-ubyte.gz files are not in {fashion_gz} "
                     f"(apt-get install dataset-fashion-mnist, or pass --fashion-mnist DIR)")
        raw.mkdir(parents=True)
        for gz in sources:
            (raw / gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
    return paths


def run(cmd: list[str], env: dict, cwd: Path) -> str:
    log(" ".join(str(c) for c in cmd))
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"speed.py: this run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def seed_run(script: Path, args: list, env: dict, cwd: Path) -> dict:
    out = run([sys.executable, script, *args], env, cwd)
    result = dict(re.findall(r"(\w+)=(\S+)", next(line for line in out.splitlines() if line.startswith("RESULT"))))
    return {"epochs": int(result["epochs"]), "train_s": float(result["train_s"]),
            "test_acc": float(result["test_acc"])}


def project_run(args: list, env: dict, cwd: Path) -> dict:
    before = set((cwd / "lightning_logs").glob("version_*"))
    run([sys.executable, ROOT / "train.py", *args, "--trainer.enable_progress_bar=false"], env, cwd)
    (run_dir,) = set((cwd / "lightning_logs").glob("version_*")) - before
    res = json.loads((run_dir / "results.json").read_text())
    return {"epochs": res["epochs"], "batch": res["batch_size"], "train_s": res["train_seconds"],
            "fit_s": res["fit_seconds"], "test_acc": res["test/acc"], "epoch_seconds": res["train_epoch_seconds"],
            "images_per_epoch": res["train_images_per_second"] * res["train_seconds"] / res["epochs"]}


def bare_run(args: list, env: dict, cwd: Path) -> dict:
    res = json.loads(run([sys.executable, ROOT / "benchmarks" / "bare_loop.py", *args], env, cwd))
    return {"epochs": res["epochs"], "batch": res["batch_size"], "train_s": sum(res["epoch_seconds"]),
            "test_acc": res["test_acc"][-1], "epoch_seconds": res["epoch_seconds"], "epoch_acc": res["test_acc"],
            "images_per_epoch": res["images_per_second"] * sum(res["epoch_seconds"]) / res["epochs"]}


def compare(project: tuple[list, dict], bare: tuple[list, dict], runs: dict, repeats: int) -> None:
    """Short default-recipe runs of train.py and the bare loop, in pairs back to back; then the ratios.

    The speed of a shared VM drifts by 20% over minutes, more than the difference being measured: each
    pair sees nearly the same machine, so "vs bare" is the median over pairs of the ratio of their median
    epochs (the first epoch of each run, which warms up, left out), and its range is printed under the
    table. "images/s" of default and bare is that of the median epoch over all their paired runs.
    """
    pairs = [(project_run(*project), bare_run(*bare)) for _ in range(repeats)]
    typical = [[statistics.median(r["epoch_seconds"][1:]) for r in pair] for pair in pairs]
    ratios = sorted(bare_s / project_s for project_s, bare_s in typical)
    runs["default"]["vs_bare"] = statistics.median(ratios)
    runs["default"]["vs_bare_range"] = (ratios[0], ratios[-1])
    runs["default"]["pairs"] = len(pairs)
    for label, i in (("default", 0), ("bare", 1)):
        runs[label]["typical_epoch_s"] = statistics.median(t for pair in pairs for t in pair[i]["epoch_seconds"][1:])


def table(name: str, runs: dict, target: float | None) -> str:
    seed_s = runs["seed"]["train_s"] if "seed" in runs else None
    for r in runs.values():
        if "epoch_seconds" in r:
            epochs = r["epoch_seconds"][1:] or r["epoch_seconds"]
            r["images_per_s"] = r["images_per_epoch"] / r.get("typical_epoch_s", statistics.median(epochs))
    lines = [f"| {name} | epochs | batch | train s | fit s | to seed acc | vs seed | test acc | images/s | vs bare |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in runs.items():
        reached = None
        if target is not None:
            if label == "bare":  # per-epoch test accuracy is known
                for i, acc in enumerate(r["epoch_acc"]):
                    if acc >= target:
                        reached = sum(r["epoch_seconds"][:i + 1])
                        break
            elif r["test_acc"] >= target and label != "default":
                reached = r["train_s"]
        reach = f"{reached:.1f} s" if reached else ("n/a" if label == "default" or target is None else "not reached")
        speedup = f"{seed_s / reached:.0f}x" if reached and seed_s and label != "seed" else ""
        ips = f"{r['images_per_s']:,.0f}" if r.get("images_per_s") else ""
        vs_bare = f"{r['vs_bare']:.0%}" if "vs_bare" in r else ""
        fit = f"{r['fit_s']:.1f}" if "fit_s" in r else ""
        lines.append(f"| {label} | {r['epochs']} | {r.get('batch', '')} | {r['train_s']:.1f} | {fit} | {reach} | "
                     f"{speedup} | {100 * r['test_acc']:.1f}% | {ips} | {vs_bare} |")
    if "vs_bare_range" in runs.get("default", {}):
        low, high = runs["default"]["vs_bare_range"]
        lines.append(f"\nvs bare: median of {runs['default']['pairs']} back-to-back pairs of runs; range {low:.0%} to "
                     f"{high:.0%}.")
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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--fashion-mnist", type=Path, default=Path("/usr/share/datasets/fashion-mnist"),
                        help="folder of Fashion-MNIST's *-ubyte.gz files")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lit-bench"), help="data and run logs")
    parser.add_argument("--only", choices=["cnn", "mlp"])
    parser.add_argument("--skip-seeds", action="store_true", help="leave out the (slow) seed scripts")
    parser.add_argument("--repeats", type=int, default=6,
                        help="back-to-back pairs of short train.py and bare-loop runs, for images/s and vs bare")
    args = parser.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_data(args.shared.resolve(), args.fashion_mnist, args.work)
    runs_dir = args.work / "runs"
    shutil.rmtree(runs_dir, ignore_errors=True)
    runs_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    accelerator = []
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the seeds pick the GPU whenever there is one
        accelerator = ["--trainer.accelerator=cpu"]
    cifar_env = {**env, "PYTHONPATH": os.pathsep.join([str(args.shared / "datasets" / "offline_cifar10"),
                                                       env["PYTHONPATH"]])}
    baselines = args.shared / "baselines"
    report = [f"Machine: {machine(args.device)}", ""]

    if args.only in (None, "cnn"):
        runs = {}
        if not args.skip_seeds:
            runs["seed"] = seed_run(baselines / "seed_cifar_cnn.py", [data["npz"]], env, runs_dir)
        common = ["--data.data_dir", data["cifar10"], *accelerator]
        runs["quick"] = project_run(["--model", "cnn", "--trainer.max_epochs=2", "--data.crop_padding=0",
                                     *common], cifar_env, runs_dir)
        runs["default"] = project_run(["--model", "cnn", *common], cifar_env, runs_dir)
        bare = ["--config", ROOT / "configs" / "cnn.yaml", "--data.data_dir", data["cifar10"], "--device", args.device]
        runs["bare"] = bare_run(bare, cifar_env, runs_dir)
        compare((["--model", "cnn", "--trainer.max_epochs=3", *common], cifar_env, runs_dir),
                ([*bare, "--epochs=3"], cifar_env, runs_dir), runs, args.repeats)
        report += [table("CNN, CIFAR-10", runs, runs.get("seed", {}).get("test_acc")), ""]

    if args.only in (None, "mlp"):
        runs = {}
        if not args.skip_seeds:
            runs["seed"] = seed_run(baselines / "seed_mnist_mlp.py", [data["fashion"], "FashionMNIST"], env,
                                    runs_dir)
        common = ["--data", "fashion_mnist", "--data.data_dir", data["fashion"], *accelerator]
        runs["quick"] = project_run(["--model", "mlp", "--trainer.max_epochs=8", *common], env, runs_dir)
        runs["default"] = project_run(["--model", "mlp", *common], env, runs_dir)
        bare = ["--config", ROOT / "configs" / "mlp.yaml", "--data", "fashion_mnist", "--data.data_dir",
                data["fashion"], "--device", args.device]
        runs["bare"] = bare_run(bare, env, runs_dir)
        compare((["--model", "mlp", "--trainer.max_epochs=8", *common], env, runs_dir),
                ([*bare, "--epochs=8"], env, runs_dir), runs, args.repeats)
        report += [table("MLP, Fashion-MNIST", runs, runs.get("seed", {}).get("test_acc")), ""]

    print("\n".join(report))


if __name__ == "__main__":
    main()
