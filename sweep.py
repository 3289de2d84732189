"""Experiments: an Optuna study whose objective trains one train.py configuration.

    python sweep.py --model mlp --data fashion_mnist --space configs/sweeps/mlp.yaml --trials 24 --parallel 2
    python sweep.py --model cnn --grid model.lr=0.02,0.05,0.1 --seeds 3
    python sweep.py --model mlp --seeds 5                     # one setting, five seeds: mean and spread

Every option that is not the sweep's own is train.py's. A trial trains that command line with its settings
(`--seeds N`: once per seed, its value the mean val/acc_best) and reports each epoch's val/acc to Optuna's median
pruner. The study lives in an Optuna storage (SQLite in lightning_logs/sweeps/NAME/study.db by default, or any
RDB URL shared by several machines), so the same command again goes on where it stopped, `optuna-dashboard` and
the `optuna` command read it, and `--parallel N` runs N processes on it, which end with it. Ctrl-C or SIGTERM
queues each trial again after its step; one whose process died (kill -9, a lost machine) falls silent and is run
again three `--heartbeat` intervals later. Each trial's runs, summary.csv and best.yaml (the best one's config.yaml:
`python train.py --config best.yaml` trains it again) are written beside, on the machine that runs the command.
"""

import argparse
import contextlib
import hashlib
import itertools
import logging
import multiprocessing
import os
import shlex
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import optuna
import pandas
import sqlalchemy
import torch
import yaml
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from datamodules.images import usable_cpus

try:  # installed: this file is lit_image_classifiers/sweep.py beside train.py
    from . import train
except ImportError:  # python sweep.py in a checkout
    import train

DONE = (TrialState.COMPLETE, TrialState.PRUNED)
STOPS = {signal.SIGINT, signal.SIGTERM}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's own options, and the rest: train.py's."""
    parser = argparse.ArgumentParser(prog="sweep.py", allow_abbrev=False, description=__doc__.split("\n")[0],
                                     usage="sweep.py [--space FILE | --grid KEY=V1,V2 ...] [--trials N] [--seeds N] "
                                           "[--parallel N] [--name NAME] [--storage URL] [--heartbeat S] "
                                           "[train.py options]")
    parser.add_argument("--space", help="a YAML file of train.py options to sample: {low, high[, log, step]} or a list")
    parser.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,...: every combination (repeatable)")
    parser.add_argument("--trials", type=int, default=20, help="settings to sample with --space (default 20)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per setting: seeds S, S+1, ... of --seed_everything")
    parser.add_argument("--parallel", type=int, default=1, help="processes running trials at once")
    parser.add_argument("--name", help="the study's name (default: from the command)")
    parser.add_argument("--storage", help="an Optuna RDB URL (default: sqlite:///lightning_logs/sweeps/NAME/study.db)")
    parser.add_argument("--heartbeat", type=int, default=20,
                        help="seconds between a running trial's heartbeats; a trial silent for three of them is "
                             "failed and run again (default 20)")
    opts, rest = parser.parse_known_args(argv)
    if opts.space and opts.grid:
        parser.error("give --space or --grid, not both")
    if min(opts.trials, opts.seeds, opts.parallel, opts.heartbeat) < 1:
        parser.error("--trials, --seeds, --parallel and --heartbeat must be at least 1")
    return opts, rest


def search_space(opts) -> dict:
    """{train.py option: a range dict, a list of choices, or (grid) a list of values}."""
    if opts.grid:
        space = {}
        for item in opts.grid:
            key, _, values = item.partition("=")
            if not values:
                raise train.UsageError(f"--grid {item}: write KEY=V1,V2,...")
            space[key.lstrip("-")] = [value(v) for v in values.split(",")]
        return space
    if not opts.space:
        return {}
    try:
        space = yaml.safe_load(Path(opts.space).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise train.UsageError(f"--space {opts.space}: cannot read it as YAML ({e})") from None
    if not isinstance(space, dict) or not all(isinstance(v, (dict, list)) for v in space.values()):
        raise train.UsageError(f"--space {opts.space}: a mapping of train.py options to {{low, high}} or lists")
    for key, spec in space.items():
        if isinstance(spec, dict) and not ({"low", "high"} <= spec.keys() <= {"low", "high", "log", "step"}):
            raise train.UsageError(f"--space {opts.space}: {key} needs low and high (and optionally log, step)")
    return {key.lstrip("-"): spec for key, spec in space.items()}


def value(text: str):
    """A grid value as a number where it is one (YAML reads 1e-3 as a string), else as YAML reads it."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def suggest(trial: optuna.Trial, key: str, spec):
    if isinstance(spec, list):
        return trial.suggest_categorical(key, spec)
    if all(isinstance(spec.get(k, 1), int) for k in ("low", "high", "step")):
        return trial.suggest_int(key, spec["low"], spec["high"], step=spec.get("step", 1), log=spec.get("log", False))
    return trial.suggest_float(key, spec["low"], spec["high"], step=spec.get("step"), log=spec.get("log", False))


def trial_args(base: list[str], params: dict, seed: int) -> list[str]:
    return [*base, *(f"--{key}={value}" for key, value in params.items()), f"--seed_everything={seed}"]


class Objective:
    """Trains a trial's setting once per seed; its value is the mean of their val/acc_best."""

    def __init__(self, base: list[str], space: dict, grid: bool, seeds: list[int], folder: Path, threads: str):
        self.base, self.space, self.grid, self.seeds = base, space, grid, seeds
        self.folder, self.threads = folder, threads
        self.stop_asked, self.in_optuna = False, False

    def on_sigterm(self, signum, frame) -> None:
        """A worker's SIGTERM: noted, and a KeyboardInterrupt where no Trainer stops after its step on it (one calls
        this too), unless inside Optuna's own steps: a trial that they leave RUNNING without a heartbeat stays so."""
        self.stop_asked = True
        if not self.in_optuna and signal.getsignal(signal.SIGTERM) == self.on_sigterm:
            raise KeyboardInterrupt

    def __call__(self, trial: optuna.Trial) -> float:
        self.in_optuna = False
        try:
            if self.stop_asked:  # while Optuna made this trial
                raise KeyboardInterrupt
            return self.run(trial)
        except (train.Stopped, KeyboardInterrupt):  # the sweep stops: the trial runs again when it goes on
            RetryHeartbeatStaleTrialCallback()(trial.study, trial.study.get_trials(deepcopy=False)[trial.number])
            optuna.logging.set_verbosity(optuna.logging.ERROR)  # the sweep's last line says it, not a traceback
            raise KeyboardInterrupt from None  # Optuna ends optimize() on it, whatever it is told to catch
        finally:
            self.in_optuna = True

    def run(self, trial: optuna.Trial) -> float:
        params = {key: suggest(trial, key, spec) for key, spec in self.space.items()}
        values = []
        for i, seed in enumerate(self.seeds):
            run_dir = self.folder / f"trial_{trial.number:04d}" / (f"seed_{seed}" if len(self.seeds) > 1 else "")
            args = trial_args(self.base, params, seed)
            trial.set_user_attr(f"command_seed_{seed}", f"{self.threads}python train.py {shlex.join(args)}")
            cli = train.TrainCLI(train.expand(args + [f"--trainer.default_root_dir={run_dir}",
                                                      "--trainer.enable_progress_bar=false",
                                                      "--trainer.enable_model_summary=false"]))
            if self.space and not self.grid and i == 0:  # the first seed's curve decides; the others only average
                from optuna_integration import PyTorchLightningPruningCallback

                cli.trainer.callbacks.append(PyTorchLightningPruningCallback(trial, monitor="val/acc"))
            try:
                record = train.fit(cli, verbose=False)
            except SystemExit as e:  # Lightning's end of a KeyboardInterrupt (1), or of a SIGTERM while testing (0)
                raise KeyboardInterrupt from e
            values.append(record["val/acc_best"] if record["val/acc_best"] is not None else record["test/acc"])
            trial.set_user_attr(f"test_acc_seed_{seed}", record["test/acc"])
            trial.set_user_attr(f"log_dir_seed_{seed}", record["log_dir"])
            if i == 0:  # in the study, for best.yaml on every machine: the run's folder is on this one
                trial.set_user_attr("config", yaml.safe_load(Path(record["log_dir"], "config.yaml").read_text()))
            print(f"trial {trial.number} ({', '.join(f'{k}={v}' for k, v in params.items()) or 'as given'}, seed "
                  f"{seed}): val/acc_best {values[-1]:.4f} in {record['fit_seconds']:.1f} s", flush=True)
        return sum(values) / len(values)


def open_study(name: str, store: RDBStorage, space: dict, grid: bool, seed: int) -> optuna.Study:
    """The study (made if new), with this process's sampler and pruner: Optuna keeps neither in the storage."""
    sampler = optuna.samplers.GridSampler(space, seed=seed) if grid else optuna.samplers.TPESampler(seed=seed)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=2) if space and not grid else None
    return optuna.create_study(study_name=name, storage=store, direction="maximize", sampler=sampler,
                               pruner=pruner, load_if_exists=True)


def work(name: str, store: RDBStorage, objective: Objective, trials: int, threads: int, seed: int) -> None:
    """One process's share: trials until the study has `trials` complete or pruned ones (or the grid is done), or
    until the sweep stops it."""
    torch.set_num_threads(threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats and retries: used knowingly
    study = open_study(name, store, objective.space, objective.grid, seed)
    signal.signal(signal.SIGTERM, objective.on_sigterm)
    with contextlib.suppress(KeyboardInterrupt):  # the sweep says so
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # blocked while this process started (see main)
        # One trial per optimize() call, and only while there is work left: several processes on one study
        # neither run more trials than asked nor (with a grid) a setting twice. Another process's running trial
        # is waited for: it ends, or its heartbeat stops and it comes back as a waiting retry to run here.
        while not objective.stop_asked:
            objective.in_optuna = True
            optuna.storages.fail_stale_trials(study)
            if work_left(study, objective, trials):
                study.optimize(objective, n_trials=1, catch=(Exception,))
            elif study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                objective.in_optuna = False
                time.sleep(store.get_heartbeat_interval())
            else:
                break


def work_left(study: optuna.Study, objective: Objective, trials: int) -> bool:
    """A trial waiting (one to run again), a grid setting without a trial, or fewer finished or running trials than
    asked."""
    existing = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in existing):
        return True
    if objective.grid:
        tried = [t.params for t in existing]
        points = itertools.product(*objective.space.values())
        return any(dict(zip(objective.space, point)) not in tried for point in points)
    return sum(t.state in (*DONE, TrialState.RUNNING) for t in existing) < trials


def worker_main(*args) -> None:
    """A process running trials, in a session of its own: a Ctrl-C at the terminal reaches the sweep alone, which
    passes each signal on once, as SIGTERM. Its sweep's end, even by SIGKILL, stops it as a SIGTERM does."""
    os.setsid()
    parent = multiprocessing.parent_process()
    threading.Thread(target=lambda: parent.join() or os.kill(os.getpid(), signal.SIGTERM), daemon=True).start()
    work(*args)


def storage(url: str, heartbeat: int = 20) -> RDBStorage:
    """The study's storage, with heartbeats: a trial whose process died is failed after three silent intervals and
    run again (twice at most)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats: used knowingly
        for _ in range(3):
            try:
                return RDBStorage(url, heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                                  heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2))
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as e:
                # Machines starting at once on a new database all create Optuna's tables, and all but one fail at
                # a step that another took first (optuna#1092): what it made is there now, so open it again.
                error = e
            except (ImportError, ValueError, sqlalchemy.exc.SQLAlchemyError) as e:  # a driver, a URL, a server
                error = e
                break
    reason = str(error.__cause__ or error).strip().splitlines()[0]
    raise train.UsageError(f"--storage {url}: cannot open it ({reason})")


def summary(study: optuna.Study, folder: Path) -> str:
    """summary.csv and best.yaml in `folder`, and the table to print."""
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "duration", "user_attrs"))
    if frame.empty:
        return f"Study {study.study_name}: no trials yet"
    frame = frame.drop(columns="user_attrs_config", errors="ignore")  # best.yaml holds the best one's
    frame.to_csv(folder / "summary.csv", index=False)
    shown = frame[["number", "state", "value", *[c for c in frame.columns if c.startswith("params_")]]]
    # (a column of durations that are all None, as when no trial has ended yet, is not a timedelta column)
    shown = shown.assign(seconds=pandas.to_timedelta(frame["duration"]).dt.total_seconds().round(1))
    lines = [f"Study {study.study_name}: {len(frame)} trials in {folder}", shown.to_string(index=False)]
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if complete:
        best = max(complete, key=lambda t: t.value)
        config = best.user_attrs["config"]
        config["trainer"]["default_root_dir"] = None  # a replay logs where its own command runs
        config["trainer"]["enable_progress_bar"] = None
        (folder / "best.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        lines.append(f"Best: trial {best.number}, val/acc_best {best.value:.4f} ({best.params or 'as given'}); "
                     f"python train.py --config {folder / 'best.yaml'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    workers, stopped = [], []

    def stop(signum, frame):  # each worker stops after its step, and at once on a second signal
        stopped.append(128 + signum)
        for w in workers:
            w.terminate() if len(stopped) == 1 else w.kill()

    previous = {s: signal.signal(s, stop) for s in STOPS}
    try:
        opts, base = parse(argv)
        space = search_space(opts)
        seed = int(train.option(base, "--seed_everything")[0] or 0)
        # A command line train.py refuses stops the sweep here, before any trial (jsonargparse exits 2): each value
        # of a grid, and a range's ends, with the first of the others.
        ends = {k: (v if isinstance(v, list) else [v["low"], v["high"]]) for k, v in space.items()}
        first = {k: v[0] for k, v in ends.items()}
        for params in [first] + [first | {k: v} for k, values in ends.items() for v in values[1:]]:
            train.build(train.expand(trial_args(base, params, seed) + ["--trainer.logger=false"]))
        name = opts.name or "sweep-" + hashlib.sha1(repr((base, space, opts.seeds)).encode()).hexdigest()[:8]
        folder = (Path("lightning_logs") / "sweeps" / name).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        url = opts.storage or f"sqlite:///{folder / 'study.db'}"
        store = storage(url, opts.heartbeat)
        study = open_study(name, store, space, bool(opts.grid), seed)
        if study.user_attrs.setdefault("command", base) != base or study.user_attrs.get("space", space) != space:
            raise train.UsageError(f"the study {name} in {url} was made by another command ("
                                   f"{shlex.join(study.user_attrs['command'])}); choose another --name")
        study.set_user_attr("command", base)
        study.set_user_attr("space", space)
        trials = opts.trials if opts.space else len(list(itertools.product(*space.values()))) if opts.grid else 1
        threads = max(1, usable_cpus() // opts.parallel)
        objective = Objective(base, space, bool(opts.grid), [seed + i for i in range(opts.seeds)], folder,
                              f"OMP_NUM_THREADS={threads} ")
        print(f"Sweep {name}: {opts.parallel} process(es); study in {url}", flush=True)
        # TPE: each worker its own seed, or they would sample the same settings, and a sweep that goes on new ones,
        # not its first ones again. A grid: one seed, which orders it, so that trial N is setting N everywhere.
        seeds = [seed + (i + opts.parallel * len(study.trials)) * (not opts.grid) for i in range(opts.parallel)]
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # until `stop` knows every worker (each unblocks them)
        if not stopped:  # (by a signal while the command line was checked); spawn, not fork: a fresh interpreter
            workers.extend(multiprocessing.get_context("spawn").Process(
                target=worker_main, args=(name, store, objective, trials, threads, s)) for s in seeds)
        for w in workers:
            w.start()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        for w in workers:
            w.join()
        study = optuna.load_study(study_name=name, storage=store)
        print(summary(study, folder))
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        code = stopped[0] if stopped else int(bool(running) or work_left(study, objective, trials))
        if code:  # a signal, or a worker that was killed or failed
            how = {130: " by Ctrl-C", 143: " by SIGTERM"}.get(code, "")
            print(f"sweep.py: stopped{how} with {sum(t.state in DONE for t in study.trials)} trials complete or "
                  f"pruned; the same command goes on with the study", file=sys.stderr)
        return code
    except Exception as e:  # a UsageError (2), or what train.py says in one line of a trial's model or data (1)
        code, message = train.explain(e)
        if code is None:
            raise
        print(f"sweep.py: error: {message}", file=sys.stderr)
        return code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
