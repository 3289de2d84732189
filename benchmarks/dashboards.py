"""What the dashboards cost, by Lightning's SimpleProfiler: the time in Dashboards' and
LearningRateMonitor's hooks.

    python benchmarks/dashboards.py --data FashionMNISTDataModule --data-dir DIR --model mlp
    python benchmarks/dashboards.py --data cifar10 --data-dir DIR --model cnn --epochs 1

DIR is a `--data.data_dir` of train.py. --rounds times, the recipe with train.py's default callbacks
is trained for --epochs with the learning rate logged every step and every 50 (Lightning's default
`log_every_n_steps`), then tested. The time in the callbacks' own hooks is measured by the profiler,
and so is unaffected by what else the machine runs; the stages' times are wall clock. It prints the
medians (and ranges) in markdown.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from lit_models import TrainingSpeed  # noqa: E402


def hooks(durations: dict, callback: str, stage: str) -> list[float]:
    """Every call's seconds of a callback's hooks of a stage ("train": training batches and epochs,
    "test")."""
    return [s for name, calls in durations.items()
            if name.startswith(f"[Callback]{callback}")
            and (f"_{stage}_" in name or (stage == "test" and name.endswith(".setup")))
            for s in calls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="fashion_mnist")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    logs = tempfile.mkdtemp(prefix="dashboards-")
    rows: dict[str, list[float]] = {}
    for _ in range(options.rounds):
        for every in (1, 50):
            run = train.TrainCLI([
                "--model", options.model, "--data", options.data,
                "--data.data_dir", options.data_dir,
                "--trainer.max_epochs", str(options.epochs),
                f"--trainer.log_every_n_steps={every}",
                "--trainer.profiler=SimpleProfiler", "--trainer.profiler.filename=profile",
                "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={logs}"],
                run=False)
            run.trainer.fit(run.model, datamodule=run.datamodule)
            start = time.perf_counter()
            run.trainer.test(run.model, datamodule=run.datamodule, verbose=False)
            test_seconds = time.perf_counter() - start
            durations = run.trainer.profiler.recorded_durations
            lr = hooks(durations, "LearningRateMonitor", "train")
            steps = run.trainer.global_step
            seconds = sum(next(c for c in run.trainer.callbacks
                               if isinstance(c, TrainingSpeed)).epoch_seconds)
            for name, value in ((f"training, {steps} steps (s), learning rate every {every}",
                                 seconds),
                                (f"LearningRateMonitor's hooks in training (ms), every {every}",
                                 1e3 * sum(lr)),
                                (f"  per step (us), every {every}", 1e6 * sum(lr) / steps),
                                (f"Dashboards' hooks in training (ms), every {every}",
                                 1e3 * sum(hooks(durations, "Dashboards", "train")))):
                rows.setdefault(name, []).append(value)
            if every == 50:
                rows.setdefault("test (s)", []).append(test_seconds)
                rows.setdefault("Dashboards' hooks in the test (s)", []).append(
                    sum(hooks(durations, "Dashboards", "test")))
    print(f"\n{options.model} on {options.data}, {options.rounds} rounds\n")
    print("| | median (range) |\n|---|---|")
    for name, values in sorted(rows.items(), key=lambda item: ("test" in item[0], item[0])):
        print(f"| {name} | {statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g}) |")


if __name__ == "__main__":
    main()
