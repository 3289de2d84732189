"""The sweep's own command line: its options, what it varies (a Plan), and the train.py command lines that
must be valid before anything runs. Everything that is not a sweep option is train.py's."""

import argparse
import hashlib
import json
import re
from pathlib import Path

from experiments.space import Plan, SpaceError, load_space, override, parse_grid, short_names

USAGE = ("sweep.py [--space FILE --trials N | --grid KEY=V1,V2,...] [--seeds N] [--name NAME] [--storage URL] "
         "[--parallel N | --per_gpu K] TRAIN.PY-OPTIONS")
DEFAULT_TRIALS = 20


class SweepError(Exception):
    """What stops a sweep that a user can fix: one line, and train.py's exit codes (2: the command line)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def parse_options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's own options, and the rest: the train.py command line every trial runs."""
    parser = argparse.ArgumentParser(prog="sweep.py", usage=USAGE, allow_abbrev=False,
                                     description="Run many train.py command lines as one Optuna study.",
                                     epilog="All other options are train.py's (python train.py --help).")
    parser.add_argument("--space", type=Path, help="a YAML search space over train.py options (configs/sweeps/)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="run every combination of these values (repeat for more options)")
    parser.add_argument("--trials", type=int, help=f"settings to sample from --space (default {DEFAULT_TRIALS}); "
                                                   f"the same command again continues up to this many")
    parser.add_argument("--seeds", type=int, default=1, help="run every setting with this many seeds: "
                                                             "--seed_everything S, S+1, ... (default 1)")
    parser.add_argument("--name", help="the study's name (default: derived from the command)")
    parser.add_argument("--storage", help="an Optuna storage: an RDB URL (sqlite:///, postgresql://, mysql://) or a "
                                          "journal file's path (default: sqlite in the sweep's folder)")
    parser.add_argument("--parallel", type=int, help="trials run at once on this machine (default: 1, or one per "
                                                     "GPU); on CPUs each gets cores/N threads, on GPUs they are "
                                                     "spread over them")
    parser.add_argument("--per_gpu", type=int, help="trials at once on each visible GPU")
    opts, rest = parser.parse_known_args(argv)
    for option in ("trials", "seeds", "parallel", "per_gpu"):
        value = getattr(opts, option)
        if value is not None and value < 1:
            raise SweepError(f"--{option} {value}: it must be at least 1")
    if opts.space and opts.grid:
        raise SweepError("--space and --grid: choose one (a space is sampled, a grid is run whole)")
    if opts.trials is not None and not opts.space:
        raise SweepError("--trials is the number of settings to sample from --space; a grid runs all of its own")
    if opts.parallel and opts.per_gpu:
        raise SweepError("--parallel and --per_gpu: choose one")
    if opts.name is not None and not re.fullmatch(r"[\w.-]+", opts.name):
        raise SweepError(f"--name {opts.name!r}: use letters, digits, '.', '-' and '_' (it names a folder)")
    return opts, rest


def make_plan(opts) -> Plan:
    try:
        if opts.space:
            return Plan(load_space(opts.space), grid=False, seeds=opts.seeds)
        return Plan(parse_grid(opts.grid), grid=True, seeds=opts.seeds)
    except SpaceError as e:
        raise SweepError(str(e)) from None


def check_variants(plan: Plan, train_argv: list[str]) -> list[tuple[list[str], str | None]]:
    """Command lines train.py must accept before anything runs: the command with every param at its first
    value, then each other extreme of each param alone (which one failed is named in the error)."""
    first = [override(p.key, p.extremes()[0]) for p in plan.params]
    variants = [(train_argv + first, None)]
    for p in plan.params:
        variants += [(train_argv + [override(p.key, v)], override(p.key, v)) for v in p.extremes()[1:]]
    return variants


def default_name(info: dict, opts, plan: Plan, train_argv: list[str]) -> str:
    """`<model>-<data>-<what varies>-<hash of the command and plan>`: the same command continues its study."""
    label = opts.space.stem if opts.space else "_".join(short_names([p.key for p in plan.params]).values())
    label = re.sub(r"[^\w.-]+", "_", label) or f"seeds{plan.seeds}"
    digest = hashlib.sha1(json.dumps([train_argv, plan.canonical()]).encode()).hexdigest()[:6]
    return f"{info['model']}-{info['data']}-{label}-{digest}"
