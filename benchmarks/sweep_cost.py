"""A sweep against the same runs as separate train.py processes: what a sweep's trials cost.

A grid of 2 learning rates x 2 seeds of short MLP runs on Fashion-MNIST, once as one `sweep.py`
command and once as four `train.py` commands one after another, in alternating order for
`--pairs` pairs. Prints a table: each pair's two wall times and their ratio, then the median and
range of the ratio (below 1: the sweep costs less than the separate runs).

    python benchmarks/sweep_cost.py --fashion-mnist DIR --pairs 3
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RATES = ["0.05", "0.1"]
SEEDS = [0, 1]


def timed(commands: list[list[str]], work: Path) -> float:
    """Seconds to run the commands one after another in `work`; a failed one stops the benchmark."""
    start = time.perf_counter()
    for command in commands:
        done = subprocess.run(command, cwd=work, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def commands(data_dir: str, epochs: int, pair: int) -> dict[str, list[list[str]]]:
    """The sweep's one command and the four separate ones, for the same runs."""
    common = ["--model", "mlp", "--data", "FashionMNISTDataModule", "--data.data_dir", data_dir,
              "--trainer.max_epochs", str(epochs)]
    grid = f"model.optimizer.lr={','.join(RATES)}"
    sweep = [sys.executable, str(ROOT / "sweep.py"), *common, "--grid", grid,
             "--seeds", str(len(SEEDS)), "--name", f"pair{pair}"]
    separate = []
    for rate in RATES:
        for seed in SEEDS:
            run = ["--model.optimizer.lr", rate, "--seed_everything", str(seed)]
            separate.append([sys.executable, str(ROOT / "train.py"), *common, *run])
    return {"sweep": [sweep], "separate": separate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fashion-mnist", required=True, help="the FashionMNIST folder's parent")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    opts = parser.parse_args()
    data_dir = str(Path(opts.fashion_mnist).resolve())
    rows = []
    for pair in range(opts.pairs):
        work = Path(tempfile.mkdtemp(prefix="sweep_cost_"))
        runs = commands(data_dir, opts.epochs, pair)
        order = ["sweep", "separate"] if pair % 2 == 0 else ["separate", "sweep"]
        seconds = {name: timed(runs[name], work) for name in order}
        rows.append((seconds["sweep"], seconds["separate"]))
    print("| pair | sweep (s) | four train.py (s) | sweep / separate |")
    print("| --- | --- | --- | --- |")
    for pair, (sweep, separate) in enumerate(rows):
        print(f"| {pair} | {sweep:.1f} | {separate:.1f} | {sweep / separate:.2f} |")
    ratios = [sweep / separate for sweep, separate in rows]
    low, high = min(ratios), max(ratios)
    print(f"median {statistics.median(ratios):.2f} (range {low:.2f}-{high:.2f})")


if __name__ == "__main__":
    main()
