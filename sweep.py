"""Experiments: an Optuna study whose objective trains one train.py configuration.

    python sweep.py --model mlp --data fashion_mnist --space configs/sweeps/mlp.yaml --parallel 2
    python sweep.py --model cnn --grid model.lr=0.02,0.05,0.1 --seeds 3
    python sweep.py --model mlp --seeds 5          # one setting, five seeds: mean and spread

Every option that is not the sweep's own is train.py's. A trial trains that command line with its
settings (`--seeds N`: once per seed, its value the mean val/acc_best, or test/acc where the runs
hold out no validation, as `--model whitened`) and reports each epoch's val/acc to Optuna's median
pruner. The study lives in an Optuna storage (SQLite in
lightning_logs/sweeps/NAME/study.db by default, or any RDB URL shared by several machines), so the
same command again goes on where it stopped, `optuna-dashboard` and the `optuna` command read it,
and `--parallel N` runs N processes on it, which end with it. Ctrl-C or SIGTERM queues each trial
again after its step; one whose process died (kill -9, a lost machine) falls silent and is run
again three `--heartbeat` intervals later. Each trial's runs, summary.csv and best.yaml (the best
one's config.yaml: `python train.py --config best.yaml` trains it again) are written beside, on the
machine that runs the command.
"""

# ruff: noqa: E402 (a stop while Python imports torch and Lightning: its handler comes first)
import sys

from lit_common.process import exit_with, python_default, stop_while_starting

if __name__ == "__main__":
    stop_while_starting()

import argparse
import contextlib
import fcntl
import hashlib
import itertools
import os
import shlex
import signal
import warnings
from pathlib import Path
from typing import NoReturn

import optuna
import pandas
import sqlalchemy
import yaml
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from datamodules.images import usable_cpus
from lit_cli.errors import UsageError, explain

try:  # installed: this file is lit_image_classifiers/sweep.py beside train.py
    from . import sweep_failures, sweep_space, train
    from . import sweep_workers as workers
except ImportError:  # python sweep.py in a checkout
    import sweep_failures
    import sweep_space
    import sweep_workers as workers
    import train

USAGE = ("sweep.py [--space FILE | --grid KEY=V1,V2 ...] [--trials N] [--seeds N] [--parallel N] "
         "[--name NAME] [--storage URL] [--heartbeat S] [train.py options]")
HELP = {
    "space": "a YAML file of train.py options to sample: {low, high[, log, step]} or a list",
    "grid": "KEY=V1,V2,...: every combination (repeatable)",
    "trials": "settings to sample with --space (default 20)",
    "seeds": "runs per setting: seeds S, S+1, ... of --seed_everything",
    "parallel": "processes running trials at once",
    "name": "the study's name (default: from the command)",
    "storage": "an Optuna RDB URL (default: sqlite:///lightning_logs/sweeps/NAME/study.db)",
    "heartbeat": ("seconds between a running trial's heartbeats; a trial silent for three of them "
                  "is failed and run again (default 20)"),
}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's own options, and the rest: train.py's."""
    parser = argparse.ArgumentParser(prog="sweep.py", allow_abbrev=False, usage=USAGE,
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--space", help=HELP["space"])
    parser.add_argument("--grid", action="append", default=[], help=HELP["grid"])
    parser.add_argument("--trials", type=int, default=20, help=HELP["trials"])
    parser.add_argument("--seeds", type=int, default=1, help=HELP["seeds"])
    parser.add_argument("--parallel", type=int, default=1, help=HELP["parallel"])
    parser.add_argument("--name", help=HELP["name"])
    parser.add_argument("--storage", help=HELP["storage"])
    parser.add_argument("--heartbeat", type=int, default=20, help=HELP["heartbeat"])
    opts, rest = parser.parse_known_args(argv)
    if opts.space and opts.grid:
        parser.error("give --space or --grid, not both")
    if min(opts.trials, opts.seeds, opts.parallel, opts.heartbeat) < 1:
        parser.error("--trials, --seeds, --parallel and --heartbeat must be at least 1")
    return opts, rest


def first_seed(base: list[str]) -> int:
    """The train.py option `--seed_everything S` (default 0): the first trial's seed; it stays in
    the command, as the study's name and record have it."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--seed_everything", type=int, default=0)
    return parser.parse_known_args(base)[0].seed_everything


def search_space(opts) -> dict:
    """{train.py option: a range dict, a list of choices, or (grid) a list of values}."""
    if opts.grid:
        return sweep_space.grid_space(opts.grid)
    if not opts.space:
        return {}
    return sweep_space.read_space(opts.space)


def storage(url: str, heartbeat: int = 20) -> RDBStorage:
    """The study's storage, with heartbeats: a trial whose process died is failed after three
    silent intervals and run again (twice at most)."""
    with warnings.catch_warnings():
        # Heartbeats: used knowingly.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=2)
        engine = {}
        if url.startswith("sqlite"):
            # SQLite's own wait for another process's lock (5 s) is short on a loaded machine: a
            # worker's query failed with "database is locked" while the others wrote.
            engine = {"connect_args": {"timeout": 60}}
        for _ in range(3):
            try:
                with tables_made_alone(url):
                    return RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat,
                                      grace_period=3 * heartbeat,
                                      heartbeat_stale_trial_callback=retry)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as e:
                # Machines starting at once on a new database all create Optuna's tables, and
                # all but one fail at a step that another took first (optuna#1092): what it
                # made is there now, so open it again.
                error = e
            except (ImportError, ValueError, sqlalchemy.exc.SQLAlchemyError) as e:
                error = e  # a driver, a URL, a server
                break
    reason = str(error.__cause__ or error).strip().splitlines()[0]
    raise UsageError(f"--storage {url}: cannot open it ({reason})")


@contextlib.contextmanager
def tables_made_alone(url: str):
    """Around the opening of an SQLite study, where it makes Optuna's tables: a lock (flock) of a
    file beside it, held by one process of this machine at a time. SQLAlchemy makes each table
    that it found missing a moment before, and sweeps that opened one new study at once each made
    some and failed on one another's ("table study_directions already exists"). Another database
    is shared by machines, which no file lock reaches: there, the retries (optuna#1092)."""
    database = sqlalchemy.engine.make_url(url).database
    if not url.startswith("sqlite") or database in (None, "", ":memory:"):
        yield
        return
    path = Path(database)
    try:
        descriptor = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a folder missing or not writable: SQLite says so, in the storage's error
        yield
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # and the lock with it


def summary(study: optuna.Study, folder: Path) -> str:
    """summary.csv and best.yaml in `folder`, and the table to print."""
    attrs = ("number", "value", "state", "params", "duration", "user_attrs")
    frame = study.trials_dataframe(attrs=attrs)
    if frame.empty:
        return f"Study {study.study_name}: no trials yet"
    # best.yaml holds the best one's config.
    frame = frame.drop(columns="user_attrs_config", errors="ignore")
    frame.to_csv(folder / "summary.csv", index=False)
    params = [c for c in frame.columns if c.startswith("params_")]
    shown = frame[["number", "state", "value", *params]]
    # to_timedelta: a column of durations that are all None, as when no trial has ended yet, is
    # not a timedelta column.
    seconds = pandas.to_timedelta(frame["duration"]).dt.total_seconds().round(1)
    shown = shown.assign(seconds=seconds)
    lines = [f"Study {study.study_name}: {len(frame)} trials in {folder}",
             shown.to_string(index=False)]
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if complete:
        lines.append(write_best(max(complete, key=lambda t: t.value), folder))
    return "\n".join(lines)


def write_best(best: FrozenTrial, folder: Path) -> str:
    """best.yaml in `folder`, the best trial's config, and the line that says how to train it."""
    config = best.user_attrs["config"]
    config["trainer"]["default_root_dir"] = None  # a replay logs where its own command runs
    config["trainer"]["enable_progress_bar"] = None
    (folder / "best.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    setting = best.params or "as given"
    objective = best.user_attrs.get("objective", "val/acc_best")  # a study of an earlier version
    return (f"Best: trial {best.number}, {objective} {best.value:.4f} ({setting}); "
            f"python train.py --config {folder / 'best.yaml'}")


def main(argv: list[str] | None = None) -> int:
    """Runs the sweep of `argv` (default: sys.argv[1:]); its exit code."""
    if argv is None:
        argv = sys.argv[1:]
    argv = list(argv)
    stop = workers.Stop()
    previous = {s: python_default(signal.signal(s, stop), s) for s in workers.STOPS}
    try:
        return run_sweep(argv, stop)
    except Exception as e:
        # A UsageError (2), or what train.py says in one line of a trial's model or data (1).
        code, message = explain(e)
        if code is None:
            raise
        print(f"sweep.py: error: {message}", file=sys.stderr)
        return code
    except SystemExit as e:
        if isinstance(e.code, int):
            return e.code
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_sweep(argv: list[str], stop: workers.Stop) -> int:
    """The command lines checked, the study opened, its workers run, and the summary printed."""
    opts, base = parse(argv)
    space = search_space(opts)
    seed = first_seed(base)
    grid = bool(opts.grid)
    check_commands(base, space, seed)
    name = opts.name or study_name(base, space, opts.seeds)
    folder = (Path("lightning_logs") / "sweeps" / name).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    url = opts.storage or study_url(folder)
    store = storage(url, opts.heartbeat)
    study = workers.open_study(name, store, space, grid, seed)
    record_command(study, url, base, space)
    trials = trial_count(opts, space)
    threads = max(1, usable_cpus() // opts.parallel)
    seeds = [seed + i for i in range(opts.seeds)]
    turn = workers.study_turn(url, folder, name)
    objective = workers.Objective(base, space, grid, seeds, folder, f"OMP_NUM_THREADS={threads} ",
                                  turn)
    samplers = sampler_seeds(seed, opts.parallel, len(study.trials), grid)
    if workers.has_work(study, objective, trials):
        print(f"Sweep {name}: {opts.parallel} process(es); study in {url}", flush=True)
        shares = [(name, store, objective, trials, threads, s) for s in samplers]
        workers.run_workers(stop, shares)
    else:
        print(f"Sweep {name}: nothing left to run; study in {url}", flush=True)
    study = optuna.load_study(study_name=name, storage=store)
    print(summary(study, folder))
    return finish(study, objective, trials, stop.codes)


def check_commands(base: list[str], space: dict, seed: int) -> None:
    """A command line train.py refuses stops the sweep here, before any trial (jsonargparse exits
    2): each value of a grid, and a range's ends, with the first of the others."""
    ends = {key: sweep_space.range_ends(key, spec) for key, spec in space.items()}
    first = {key: values[0] for key, values in ends.items()}
    others = [first | {key: v} for key, values in ends.items() for v in values[1:]]
    for params in [first, *others]:
        args = workers.trial_args(base, params, seed)
        train.TrainCLI(args + ["--trainer.logger=false"], run=False)


def study_name(base: list[str], space: dict, seeds: int) -> str:
    """The default name, of the command, space and seeds: the same command finds its study again."""
    digest = hashlib.sha1(repr((base, space, seeds)).encode()).hexdigest()
    return "sweep-" + digest[:8]


def study_url(folder: Path) -> str:
    """The SQLite URL of the study in `folder`, its path escaped: a sweep's name may hold '?', '#'
    or '%', which a URL reads as its query, fragment or an escape."""
    url = sqlalchemy.engine.URL.create("sqlite", database=str(folder / "study.db"))
    return url.render_as_string()


def record_command(study: optuna.Study, url: str, base: list[str], space: dict) -> None:
    """The command and space noted in the study; a study made by another command is refused."""
    if made_by_another(study, base, space):
        command = shlex.join(study.user_attrs["command"])
        raise UsageError(f"the study {study.study_name} in {url} was made by another command "
                         f"({command}); choose another --name")
    study.set_user_attr("command", base)
    study.set_user_attr("space", space)


def made_by_another(study: optuna.Study, base: list[str], space: dict) -> bool:
    """Whether the study notes a command or space other than these."""
    if study.user_attrs.get("command", base) != base:
        return True
    return study.user_attrs.get("space", space) != space


def trial_count(opts, space: dict) -> int:
    """The trials to run: `--trials` of a space, every point of a grid, or one setting."""
    if opts.space:
        return opts.trials
    if opts.grid:
        return len(list(itertools.product(*space.values())))
    return 1


def sampler_seeds(seed: int, parallel: int, trials_so_far: int, grid: bool) -> list[int]:
    """Each worker's sampler seed. TPE: each worker its own seed, or they would sample the same
    settings, and a sweep that goes on new ones, not its first ones again. A grid: one seed, which
    orders it, so that trial N is setting N everywhere."""
    if grid:
        return [seed] * parallel
    return [seed + i + parallel * trials_so_far for i in range(parallel)]


def finish(study: optuna.Study, objective: workers.Objective, trials: int, codes: list[int]) -> int:
    """The sweep's exit code, and its last line where it did not end well: stopped by a signal,
    its trials failing the same way, a worker killed or failed, or no trial complete."""
    if codes:
        return stopped(study, codes[0])
    failing = sweep_failures.failing_the_same_way(study, trials)
    if failing:
        print(f"sweep.py: error: the trials keep failing the same way, so the sweep stopped: "
              f"{failing}", file=sys.stderr)
        return 1
    if unfinished(study, objective, trials):
        return stopped(study, 1)
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        print(f"sweep.py: error: no trial completed{failures(study)}", file=sys.stderr)
        return 1
    return 0


def stopped(study: optuna.Study, code: int) -> int:
    """The line of a sweep stopped short, by a signal or by a worker that was killed or failed;
    `code`."""
    how = {130: " by Ctrl-C", 143: " by SIGTERM"}.get(code, "")
    done = sum(t.state in workers.DONE for t in study.trials)
    print(f"sweep.py: stopped{how} with {done} trials complete or pruned; the same command "
          f"goes on with the study", file=sys.stderr)
    return code


def failures(study: optuna.Study) -> str:
    """How many trials failed, and the last one's error."""
    failed = sweep_failures.failed(study)
    if not failed:
        return ""
    return f" ({len(failed)} failed; the last with: {failed[-1].user_attrs['error']})"


def unfinished(study: optuna.Study, objective: workers.Objective, trials: int) -> int:
    """1 where a trial still runs (its worker was killed) or work is left (a worker failed)."""
    return int(workers.has_work(study, objective, trials))


def command() -> NoReturn:
    """`lit-sweep ARGS`, the installed command, as `python sweep.py ARGS`: main(), then the
    process's end (lit_common.process.exit_with)."""
    exit_with(main())


if __name__ == "__main__":
    command()
