"""What each callback costs a training step, by Lightning's own SimpleProfiler.

    python benchmarks/callback_cost.py --fashion-mnist DIR --epochs 4

Runs `train.py --model mlp --data FashionMNISTDataModule` with `--trainer.profiler SimpleProfiler`
in a pseudo-terminal (`script`), as a user runs it: the default progress bar redraws as in a shell.
Lightning times every hook of every callback ("[Callback]NAME.HOOK"); this adds up each
callback's hooks over the fit (validation hooks left out) and divides by the training steps, then
prints a table: the callback, what its per-batch hooks cost a step and their share of Lightning's
`run_training_batch`, and what its other hooks (epoch ends, checkpoints, setup) cost spread over
the steps.
"""

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\|\s+(\S.*?)\s+\|\s+([\d.e+-]+)\s+\|\s+(\d+)\s+\|\s+([\d.e+-]+)\s+\|")
CALLBACK = re.compile(r"^\[Callback\](\w+).*\.(\w+)$")
STEP_HOOKS = ("batch", "backward", "optimizer", "zero_grad")


def profile(data_dir: str, epochs: int, work: Path) -> dict[str, tuple[float, int]]:
    """Each profiled action's total seconds and calls, from the profiler's report."""
    args = ["--model", "mlp", "--data", "FashionMNISTDataModule", "--data.data_dir", data_dir,
            "--trainer.max_epochs", str(epochs), "--trainer.profiler", "SimpleProfiler",
            "--trainer.profiler.dirpath", str(work), "--trainer.profiler.filename", "profile"]
    command = shlex.join([sys.executable, str(ROOT / "train.py"), *args])
    subprocess.run(["script", "-qec", command, "/dev/null"], cwd=work, check=True,
                   stdout=subprocess.DEVNULL)
    actions = {}
    for line in (work / "fit-profile.txt").read_text().splitlines():
        row = ROW.match(line)
        if row:
            actions[row[1]] = (float(row[4]), int(row[3]))
    return actions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fashion-mnist", required=True, help="the FashionMNIST folder's parent")
    parser.add_argument("--epochs", type=int, default=4)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="callback_cost_"))
    actions = profile(str(Path(opts.fashion_mnist).resolve()), opts.epochs, work)
    step_seconds, steps = actions["run_training_batch"]
    per_step, elsewhere = defaultdict(float), defaultdict(float)
    for action, (seconds, _) in actions.items():
        hook = CALLBACK.match(action)
        if hook is None or hook[2].startswith(("on_validation", "on_sanity")):
            continue
        if any(word in hook[2] for word in STEP_HOOKS):
            per_step[hook[1]] += seconds
        else:
            elsewhere[hook[1]] += seconds
    print(f"{steps} training steps, {1000 * step_seconds / steps:.2f} ms each (run_training_batch)")
    print("| callback | step hooks, ms per step | share of a step | its other hooks, ms per step |")
    print("| --- | --- | --- | --- |")
    for name in sorted(per_step.keys() | elsewhere.keys(), key=lambda n: -per_step[n]):
        print(f"| {name} | {1000 * per_step[name] / steps:.3f} | "
              f"{per_step[name] / step_seconds:.1%} | {1000 * elsewhere[name] / steps:.3f} |")


if __name__ == "__main__":
    main()
