"""sweep.py's worker processes: each runs trials of the study, one train.py configuration once
per seed, until the study has what the sweep asked for or the sweep stops it."""

import contextlib
import fcntl
import hashlib
import itertools
import logging
import multiprocessing
import os
import shlex
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import NoReturn

import optuna
import sqlalchemy
import torch
import yaml
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from lit_cli.errors import Stopped, UsageError
from lit_common.process import leave_the_rest_to_the_system

try:  # installed: this file is lit_image_classifiers/sweep_workers.py beside train.py
    from . import sweep_failures, sweep_space, train
except ImportError:  # python sweep.py in a checkout
    import sweep_failures
    import sweep_space
    import train

DONE = sweep_failures.DONE
STOPS = {signal.SIGINT, signal.SIGTERM}
# What a worker imports that costs seconds, imported once in the forkserver that forks the workers
# (run_workers): names found wherever the interpreter is, as this checkout's own modules may not be
# on the server's path (Python 3.11's forkserver ignores the sweep's sys.path).
PRELOAD = ["torch", "torchvision", "lightning.pytorch", "optuna", "sqlalchemy", "tensorboard",
           "jsonargparse"]
# How often a process with no trial to run looks again at another's running one: it ends, or its
# heartbeat goes stale. Not the heartbeat interval: a sweep's end waited that long for nothing.
POLL_SECONDS = 0.25


def suggest(trial: optuna.Trial, key: str, spec):
    """The trial's value of one option, of its range or list (sweep_space.distribution)."""
    made = sweep_space.distribution(key, spec)
    if isinstance(made, CategoricalDistribution):
        return trial.suggest_categorical(key, made.choices)
    if isinstance(made, IntDistribution):
        return trial.suggest_int(key, made.low, made.high, step=made.step, log=made.log)
    return trial.suggest_float(key, made.low, made.high, step=made.step, log=made.log)


def setting_of(params: dict) -> str:
    """A trial's setting, as its lines say it."""
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "as given"


def trial_args(base: list[str], params: dict, seed: int) -> list[str]:
    """train.py's command line of one setting and seed."""
    options = [f"--{key}={value}" for key, value in params.items()]
    return [*base, *options, f"--seed_everything={seed}"]


def prunes(space: dict, grid: bool) -> bool:
    """Whether the median pruner stops poor trials early: with a sampled space, not a grid."""
    return bool(space) and not grid


class FileTurn:
    """The turn of the processes of one machine: a lock on a file (flock), which the system takes
    back from a killed holder, where a multiprocessing Lock stays taken."""

    def __init__(self, path: Path):
        self.path, self.descriptor = path, None  # opened in the worker

    def try_take(self) -> bool:
        if self.descriptor is None:
            self.descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def give_back(self) -> None:
        fcntl.flock(self.descriptor, fcntl.LOCK_UN)


class ServerTurn:
    """The turn of every machine's processes on a study in PostgreSQL: an advisory lock of the
    server, held by a connection of its own. The server ends the lock with the connection: a
    killed holder's at once, a dead machine's within about 25 s (TCP keepalives)."""

    KEEPALIVES = "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"

    def __init__(self, url: str, study: str):
        self.url, self.connection = url, None  # connected in the worker
        digest = hashlib.blake2b(f"lit-sweep turn {study}".encode(), digest_size=8).digest()
        self.key = int.from_bytes(digest, "big", signed=True)

    def try_take(self) -> bool:
        if self.connection is None:
            engine = sqlalchemy.create_engine(self.url, poolclass=sqlalchemy.pool.NullPool,
                                              isolation_level="AUTOCOMMIT",
                                              connect_args={"options": self.KEEPALIVES})
            self.connection = engine.connect()
        query = sqlalchemy.text("SELECT pg_try_advisory_lock(:key)")
        return bool(self.connection.execute(query, {"key": self.key}).scalar())

    def give_back(self) -> None:
        # Unlocked before the connection closes: the server ends a closed connection's session, and
        # its locks, a moment later.
        query = sqlalchemy.text("SELECT pg_advisory_unlock(:key)")
        self.connection.execute(query, {"key": self.key})
        self.connection.close()
        self.connection = None


def study_turn(url: str, folder: Path, study: str) -> FileTurn | ServerTurn:
    """The turn to choose a trial of `study` (at `url`): among all machines where the study is on
    a PostgreSQL server, else among this machine's processes."""
    if url.startswith("postgresql"):
        return ServerTurn(url, study)
    return FileTurn(folder / ".turn.lock")


class Objective:
    """Trains a trial's setting once per seed; its value is the mean of their val/acc_best (of
    their test/acc where they hold out no validation)."""

    def __init__(self, base: list[str], space: dict, grid: bool, seeds: list[int], folder: Path,
                 threads: str, turn: FileTurn | ServerTurn):
        self.base, self.space, self.grid, self.seeds = base, space, grid, seeds
        self.folder, self.threads = folder, threads
        self.stop_asked, self.in_train = False, False
        # One process of the study at a time chooses a trial, until its setting is in the study:
        # two that both saw the one waiting retry, or the last grid setting free, would run it,
        # and a new trial besides (more than asked). A wait with a deadline, in place of a lock,
        # ran two choices at once on a loaded machine.
        self.turn, self.holds_turn = turn, False

    def take_turn(self) -> None:
        """This process's turn to choose a trial, or none once a stop is asked."""
        while not self.stop_asked and not self.holds_turn:
            self.holds_turn = self.turn.try_take()
            if not self.holds_turn:
                time.sleep(0.05)

    def end_turn(self) -> None:
        """The turn given back: the chosen trial's setting is in the study, or there is none."""
        if self.holds_turn:
            self.holds_turn = False
            self.turn.give_back()

    def on_sigterm(self, signum, frame) -> None:
        """A worker's SIGTERM: noted, and a KeyboardInterrupt while train.py's command runs, where
        no Trainer stops after its step on it (one calls this too). Anywhere else the worker stops
        at its next check of `stop_asked`: raised inside a read or write of the study (Optuna's
        own steps, a trial's attributes), it left an SQLite statement holding its lock, and the
        other worker waited a minute for it."""
        self.stop_asked = True
        if self.in_train and signal.getsignal(signal.SIGTERM) == self.on_sigterm:
            raise KeyboardInterrupt

    def __call__(self, trial: optuna.Trial) -> float:
        """The trial's value; where the sweep stops, the trial runs again when it goes on; where it
        fails, its error is noted (sweep_failures)."""
        try:
            params = {key: suggest(trial, key, spec) for key, spec in self.space.items()}
            self.end_turn()  # the next process to choose sees this setting taken
            if self.stop_asked:  # while Optuna made this trial
                raise KeyboardInterrupt
            return self.run(trial, params)
        except optuna.TrialPruned:
            raise
        except (Stopped, KeyboardInterrupt):
            self.queue_again(trial)
        except Exception as e:
            if self.stop_asked:  # broken by the stop
                self.queue_again(trial)
            sweep_failures.note_failure(trial, e, setting_of(trial.params))
            raise

    def queue_again(self, trial: optuna.Trial) -> NoReturn:
        """The stopped trial queued to run again, and optimize() ended."""
        frozen = trial.study.get_trials(deepcopy=False)[trial.number]
        RetryHeartbeatStaleTrialCallback()(trial.study, frozen)
        # Optuna ends optimize() on it, whatever it is told to catch.
        raise KeyboardInterrupt from None

    def run(self, trial: optuna.Trial, params: dict) -> float:
        """The mean val/acc_best (or test/acc) of the trial's setting (`params`) over the seeds."""
        values = [self.run_seed(trial, params, i, seed) for i, seed in enumerate(self.seeds)]
        return sum(values) / len(values)

    def run_seed(self, trial: optuna.Trial, params: dict, i: int, seed: int) -> float:
        """The setting trained with the `i`th seed, noted in the trial; its val/acc_best, or its
        test/acc where it held out no validation."""
        if self.stop_asked:  # while the trial's last seed was recorded
            raise KeyboardInterrupt
        args = trial_args(self.base, params, seed)
        command = f"{self.threads}python train.py {shlex.join(args)}"
        trial.set_user_attr(f"command_seed_{seed}", command)
        callbacks = []
        # The first seed's curve decides; the others only average.
        if i == 0 and prunes(self.space, self.grid):
            from optuna_integration import PyTorchLightningPruningCallback

            callbacks.append(PyTorchLightningPruningCallback(trial, monitor="val/acc"))
        quiet = [f"--trainer.default_root_dir={self.run_dir(trial, seed)}",
                 "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
        self.in_train = True
        try:
            record = train.TrainCLI(args + quiet, callbacks=callbacks).results
        except SystemExit as e:
            if self.stop_asked:  # Lightning's end of a KeyboardInterrupt (1)
                raise KeyboardInterrupt from e
            # jsonargparse's end of a value it refuses (2)
            raise UsageError(f"train.py exited with code {e.code} (its message is above)") from None
        finally:
            self.in_train = False
        objective, accuracy = "val/acc_best", record["val/acc_best"]
        if accuracy is None:  # no validation split (--data.val_size 0): the test set decides
            objective, accuracy = "test/acc", record["test/acc"]
        trial.set_user_attr("objective", objective)
        trial.set_user_attr(f"test_acc_seed_{seed}", record["test/acc"])
        trial.set_user_attr(f"log_dir_seed_{seed}", record["log_dir"])
        if i == 0:  # in the study, for best.yaml on every machine: the run's folder is on this one
            config = yaml.safe_load(Path(record["log_dir"], "config.yaml").read_text())
            trial.set_user_attr("config", config)
        print(f"trial {trial.number} ({setting_of(params)}, seed {seed}): {objective} "
              f"{accuracy:.4f} in {record['fit_seconds']:.1f} s", flush=True)
        return accuracy

    def run_dir(self, trial: optuna.Trial, seed: int) -> Path:
        """The trial's folder, with a folder per seed where there are several."""
        folder = self.folder / f"trial_{trial.number:04d}"
        if len(self.seeds) > 1:
            return folder / f"seed_{seed}"
        return folder


def open_study(name: str, store: RDBStorage, space: dict, grid: bool, seed: int) -> optuna.Study:
    """The study (made if new), with this process's sampler and pruner: Optuna keeps neither in
    the storage."""
    if grid:
        sampler = optuna.samplers.GridSampler(space, seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed)
    pruner = None
    if prunes(space, grid):
        pruner = optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=2)
    return optuna.create_study(study_name=name, storage=store, direction="maximize",
                               sampler=sampler, pruner=pruner, load_if_exists=True)


def work(name: str, store: RDBStorage, objective: Objective, trials: int, threads: int,
         seed: int) -> None:
    """One process's share: trials until the study has `trials` complete or pruned ones (or the
    grid is done), until its trials keep failing the same way, or until the sweep stops it."""
    torch.set_num_threads(threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    # A failed trial is said in one line (sweep_failures), a stopped one in the sweep's last line:
    # not in Optuna's warning with the traceback.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    # Heartbeats and retries: used knowingly.
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    study = open_study(name, store, objective.space, objective.grid, seed)
    signal.signal(signal.SIGTERM, objective.on_sigterm)
    with contextlib.suppress(KeyboardInterrupt):  # the sweep says so
        # Blocked while this process started (see run_workers).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        # One trial per optimize() call, and only while there is work left: several processes on
        # one study neither run more trials than asked nor (with a grid) a setting twice. Another
        # process's running trial is waited for: it ends, or its heartbeat stops and it comes back
        # as a waiting retry to run here.
        while not objective.stop_asked:
            optuna.storages.fail_stale_trials(study)
            if ran_a_trial(study, objective, trials):
                if sweep_failures.failing_the_same_way(study, trials):
                    break  # the sweep says why (sweep.finish)
                continue
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if objective.stop_asked or not running:
                break
            time.sleep(POLL_SECONDS)


def ran_a_trial(study: optuna.Study, objective: Objective, trials: int) -> bool:
    """Whether this process found work left and ran a trial of it, in its turn among the sweep's
    processes (Objective.take_turn)."""
    objective.take_turn()
    try:
        if objective.stop_asked or not work_left(study, objective, trials):
            return False
        study.optimize(objective, n_trials=1, catch=(Exception,))
        return True
    finally:
        objective.end_turn()


def has_work(study: optuna.Study, objective: Objective, trials: int) -> bool:
    """Whether workers would do anything: work left, or another process's running trial to wait
    for (it ends, or its heartbeat stops and it comes back as a retry). The same command again on
    a finished study starts none."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return bool(running) or work_left(study, objective, trials)


def work_left(study: optuna.Study, objective: Objective, trials: int) -> bool:
    """A trial waiting (one to run again), a grid setting without a trial, or fewer finished or
    running trials than asked."""
    existing = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in existing):
        return True
    if objective.grid:
        tried = [t.params for t in existing]
        points = itertools.product(*objective.space.values())
        return any(dict(zip(objective.space, point)) not in tried for point in points)
    return sum(t.state in (*DONE, TrialState.RUNNING) for t in existing) < trials


def worker_main(*args) -> None:
    """A process running trials, in a session of its own: a Ctrl-C at the terminal reaches the
    sweep alone, which passes each signal on once, as SIGTERM. Its sweep's end, even by SIGKILL,
    stops it as a SIGTERM does."""
    os.setsid()
    parent = multiprocessing.parent_process()
    threading.Thread(target=stop_after, args=(parent,), daemon=True).start()
    work(*args)
    leave_the_rest_to_the_system()  # multiprocessing ends the process


def stop_after(parent) -> None:
    """A SIGTERM to this process once `parent` (its sweep) has ended."""
    parent.join()
    os.kill(os.getpid(), signal.SIGTERM)


class Stop:
    """The sweep's SIGINT and SIGTERM handler: each worker stops after its step, and at once on a
    second signal. `codes` holds each signal's exit code."""

    def __init__(self):
        self.workers, self.codes = [], []

    def __call__(self, signum, frame) -> None:
        self.codes.append(128 + signum)
        for w in self.workers:
            if len(self.codes) == 1:
                w.terminate()
            else:
                w.kill()


def run_workers(stop: Stop, shares: list[tuple]) -> None:
    """A process per share (the arguments of `work`), started and waited for."""
    # Blocked until `stop` knows every worker (each unblocks them).
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    # None where a signal came while the command lines were checked. Forked from a fresh
    # interpreter that imported torch, Lightning and Optuna once for them all: the forkserver,
    # Python 3.14's own default; never from the sweep's process, its handlers and state.
    # Spawned, each worker imported them again, seconds of CPU each.
    if not stop.codes:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        stop.workers.extend(context.Process(target=worker_main, args=share) for share in shares)
    for w in stop.workers:
        w.start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    for w in stop.workers:
        w.join()
