r"""Where a training step's host work goes, counted: Python calls a step, component by component.

    python benchmarks/step_calls.py --data.data_dir DIR      # Fashion-MNIST's IDX files in DIR

cProfile counts every Python call exactly: the counts are the same on a loaded machine as on a
quiet one, where a step's milliseconds are not (docs/benchmarks.md has both). train.py's MLP
(784-16-10, batches of 256: a network too small to matter) fits 1 and then 2 epochs with no
validation, for each set of callbacks below, in this process; a set's calls a step are the
difference over an epoch's steps (a first fit warms jsonargparse's caches and lazy imports). Each
row adds one component to the row above it; the last is train.py's whole default set.
"""

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402

FIT = ["--model", "mlp", "--data", "FashionMNISTDataModule", "--model.net.hidden", "16",
       "--data.batch_size", "256", "--trainer.limit_val_batches", "0", "--data.val_size", "0",
       "--trainer.enable_model_summary", "false"]
NO_LOGGER = ["--trainer.logger", "false"]
SPEED, LAST = "lit_models.TrainingSpeed", "lit_models.LastCheckpoint"
BAR = {"class_path": "lightning.pytorch.callbacks.TQDMProgressBar",
       "init_args": {"refresh_rate": 10}}
LR, BOARDS = "lightning.pytorch.callbacks.LearningRateMonitor", "lit_models.Dashboards"


def callbacks(*specs) -> list[str]:
    """--trainer.callbacks of these class paths (or {class_path, init_args})."""
    listed = [spec if isinstance(spec, dict) else {"class_path": spec} for spec in specs]
    return ["--trainer.callbacks", json.dumps(listed)]


# Each row's options, from Lightning's loop with the model's own step and one clock (and train.py's
# RunRecord, which every command has) to train.py's defaults.
ROWS = {
    "Lightning's loop, the model's step, TrainingSpeed": [
        *NO_LOGGER, "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar",
        "false", *callbacks(SPEED)],
    "+ LastCheckpoint": [*NO_LOGGER, "--trainer.enable_progress_bar", "false",
                         *callbacks(SPEED, LAST)],
    "+ TQDMProgressBar (every 10 batches)": [*NO_LOGGER, *callbacks(SPEED, LAST, BAR)],
    "+ TensorBoard logger, SaveConfig": callbacks(SPEED, LAST, BAR),
    "+ LearningRateMonitor": callbacks(SPEED, LAST, BAR, LR),
    "+ Dashboards": callbacks(SPEED, LAST, BAR, LR, BOARDS),
    "train.py's defaults (+ the best checkpoint)": [],
}


def calls(args: list[str], epochs: int) -> int:
    profile = cProfile.Profile()
    profile.enable()
    code = train.main([*args, "--trainer.max_epochs", str(epochs)])
    profile.disable()
    if code != 0:
        raise SystemExit(f"train.py {' '.join(args)} exited {code}")
    return sum(stats[1] for stats in pstats.Stats(profile).stats.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data.data_dir", dest="data_dir", required=True)
    options = parser.parse_args()
    steps = 60000 // 256
    rows, previous = [], None
    with tempfile.TemporaryDirectory() as work, open(os.devnull, "w") as nowhere:
        os.chdir(work)
        for name, options_of_row in ROWS.items():
            args = [*FIT, "--data.data_dir", options.data_dir, *options_of_row]
            stdout, sys.stdout = sys.stdout, nowhere
            try:
                calls(args, 1)  # warm
                per_step = (calls(args, 2) - calls(args, 1)) / steps
            finally:
                sys.stdout = stdout
            added = ""
            if previous is not None:
                added = f"{per_step - previous:+.0f}"
            rows.append(f"| {name} | {per_step:.0f} | {added} |")
            previous = per_step
    print("| what runs | Python calls a step | adds |\n|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
