r"""Where a training step's milliseconds go: the bare loop, Lightning's loop, train.py's Trainer.

    python benchmarks/loop_cost.py --model mlp --data FashionMNISTDataModule --data.data_dir DIR \
        --trainer.max_epochs 4 [--pairs 3]

Any train.py options name the recipe. In one process, in rounds (each loop takes the first place
in turn), the same batches, model and optimizer train four ways:

- bare: benchmarks/bare_loop.py's loop (forward, loss, backward, step, schedule);
- Lightning, the bare loop's step: `Trainer.fit` of the model with a training_step of forward and
  loss alone, and one callback, TrainingSpeed, as the clock: no logger, checkpoints, progress bar
  or model summary;
- Lightning: the same with the model's own training_step, which also sums the training loss and
  accuracy and logs them;
- train.py: the whole command in this process (its default callbacks, TensorBoard, checkpoints,
  the progress bar writing to this process's stderr), timed by its own TrainingSpeed.

Each run's median epoch (the first, which warms up, left out) over its steps is its milliseconds a
step. Prints a table: each loop's milliseconds a step (median of the rounds, and the range), the
bare loop's speed as a share of its own in each round, and what each layer adds to a step.
"""

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import types
from pathlib import Path

import lightning as L
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bare_loop  # noqa: E402
from speed import spread  # noqa: E402

import train  # noqa: E402
from lit_models import TrainingSpeed  # noqa: E402


def per_step(epoch_seconds: list[float], steps: int) -> float:
    """Milliseconds a step in the median epoch, the first left out."""
    return statistics.median(epoch_seconds[1:] or epoch_seconds) / steps * 1000


def bare(args: list[str]) -> float:
    result = bare_loop.train_bare(args)
    return per_step(result["epoch_seconds"], result["steps"])


def bare_step(model, batch, batch_idx):
    """The bare loop's step: forward and loss."""
    images, labels = batch
    return F.cross_entropy(model(images), labels, label_smoothing=model.hparams.label_smoothing)


def lightning_bare_step(args: list[str]) -> float:
    return lightning(args, bare_step)


def lightning(args: list[str], training_step=None) -> float:
    quiet = ["--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    cli = train.TrainCLI(args + quiet, run=False)
    if training_step is not None:
        cli.model.training_step = types.MethodType(training_step, cli.model)
    clock = TrainingSpeed()
    trainer = L.Trainer(accelerator=cli.trainer.accelerator, devices=1,
                        precision=cli.trainer.precision, max_epochs=cli.trainer.max_epochs,
                        callbacks=[clock], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(cli.model, cli.datamodule)
    return per_step(clock.epoch_seconds, trainer.num_training_batches)


def train_py(args: list[str]) -> float:
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)  # its lightning_logs/ there
        try:  # its model summary and test table out of the way of this table
            with open(os.devnull, "w") as nowhere, contextlib.redirect_stdout(nowhere):
                cli = train.TrainCLI(args)
        finally:
            os.chdir(here)
    (clock,) = [c for c in cli.trainer.callbacks if isinstance(c, TrainingSpeed)]
    return per_step(clock.epoch_seconds, cli.trainer.num_training_batches)


LOOPS = {"bare PyTorch loop": bare, "Lightning's loop, the bare loop's step": lightning_bare_step,
         "Lightning's loop, the model's step": lightning, "train.py's Trainer": train_py}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="rounds of the four loops")
    options, args = parser.parse_known_args()
    ms = {name: [] for name in LOOPS}
    for round_ in range(options.pairs):
        names = list(LOOPS)
        names = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in names:
            ms[name].append(LOOPS[name](args))
            print(f"round {round_ + 1}: {name} {ms[name][-1]:.3f} ms a step", file=sys.stderr)
    floor = ms["bare PyTorch loop"]
    print(f"\n{' '.join(args)}; {os.cpu_count()} CPUs\n")
    print("| loop | ms a step | bare loop's speed as a share | adds a step |")
    print("|---|---|---|---|")
    previous = None
    for name, values in ms.items():
        shares = [f / v for f, v in zip(floor, values)]
        added = "" if previous is None else f"{statistics.median(values) - previous:+.3f} ms"
        print(f"| {name} | {spread(values, '.3f')} | {spread(shares, '.0%')} | {added} |")
        previous = statistics.median(values)


if __name__ == "__main__":
    main()
