"""Experiments: an Optuna study whose objective trains one train.py configuration.

    python sweep.py --model mlp --data FashionMNISTDataModule --space configs/sweeps/mlp.yaml
    python sweep.py --model cnn --grid model.optimizer.lr=0.02,0.05,0.1 --seeds 3 --parallel 2
    python sweep.py --model mlp --seeds 5          # one setting, five seeds: mean and spread

Every option that is not the sweep's own is train.py's. A trial trains its setting once per seed
(`--seeds N`: seeds S, S+1, ... of `--seed_everything`), and its value is the mean of the runs'
`--objective`: a validation metric, as the module logs it (a sweep never ranks on test data). The
study lives in an Optuna storage (SQLite in lightning_logs/sweeps/NAME/study.db, or any RDB URL
that machines share), so the same command again goes on where it stopped, and `optuna-dashboard`
reads it. A Ctrl-C or SIGTERM stops each trial after its step, to run again then; the trial of a
killed worker runs again once its heartbeats have stopped for three `--heartbeat` intervals.
lit_sweep/study.py holds the parts.
"""

import argparse
import sys

from lit_cli.errors import exit_code

try:  # installed: this file is lit_image_classifiers/sweep.py beside train.py
    from . import train
except ImportError:  # python sweep.py in a checkout
    import train


def parse(argv: list[str]) -> argparse.Namespace:
    """The sweep's own options; `train` holds the rest, train.py's."""
    parser = argparse.ArgumentParser("sweep.py", epilog="Others: train.py's.", allow_abbrev=False)
    add, one = parser.add_argument, parser.add_mutually_exclusive_group().add_argument
    one("--space", help="a YAML file of train.py options: {low, high[, log, step]} or choices")
    one("--grid", action="append", default=[], help="KEY=V1,V2,...: every combination")
    add("--trials", type=int, default=20, help="settings to sample from --space (default 20)")
    add("--seeds", type=int, default=1, help="runs of each setting, seeds S, S+1, ...: the mean")
    add("--parallel", type=int, default=1, help="worker processes that run trials at once")
    add("--name", help="the study's name (default: from the command)")
    add("--storage", help="an RDB URL (default sqlite:///lightning_logs/sweeps/NAME/study.db)")
    add("--heartbeat", type=int, default=20, help="seconds between a running trial's heartbeats")
    add("--objective", default="val/acc_best", help="the validation metric that ranks settings")
    add("--direction", choices=["maximize", "minimize"], default="maximize")
    opts, opts.train = parser.parse_known_args(argv)  # (opts is assigned first)
    if min(opts.trials, opts.seeds, opts.parallel, opts.heartbeat) < 1:
        parser.error("--trials, --seeds, --parallel and --heartbeat must be at least 1")
    return opts


def main(argv: list[str] | None = None) -> int:
    """`python sweep.py ARGS` (`lit-sweep ARGS`): the sweep, its exit code, and one line for what
    went wrong."""
    try:
        from lit_sweep import study  # Optuna's: where it is missing, one line names the extra

        return study.sweep(parse(argv), train.TrainCLI)  # argparse reads sys.argv for None
    except (SystemExit, Exception) as e:  # argparse's --help (0) and its errors (2) too
        return exit_code(e, program="sweep.py")


if __name__ == "__main__":
    sys.exit(main())
