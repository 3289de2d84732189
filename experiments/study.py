"""The Optuna study of a sweep: its storage, which trial runs which setting, and which trials count.

Every train.py run is one Optuna trial. A trial's user attributes say what it is and how it ended:
`setting` (the grid point's index, or the number of the trial that sampled the setting) and `seed_index`
make its *slot*; `seed`, `overrides` and `command` say what ran; `worker` (host:pid) who ran it; `results`,
`error` (failed), `interrupted` (stopped before it finished: run again) or `surplus` (never ran).

How trials are handed out, so that several processes on one study (`--storage`) never run a slot twice
and together run exactly `--trials` settings: a slot that must run (a grid point, the other seeds of a
completed setting, a trial that was interrupted) is *enqueued* as a WAITING trial, which Optuna lets only
one process take (SQLite: see lock_sqlite). Two processes may enqueue the same slot at the same moment,
and two may ask for a new setting when one is left; of such a pair, the trial with the lower number runs
and the other is marked `surplus` without running (`claim`). The decision only looks at trials with lower
numbers, which every process sees alike.
"""

import contextlib
import fcntl
import socket
import threading
import warnings
import zlib
from pathlib import Path

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from datamodules.processes import alive

# RDB storages (SQLite, PostgreSQL, MySQL) keep Optuna's heartbeat: a trial whose process stopped beating
# for GRACE_S (a machine that died) is failed and run again by whichever sweep process looks next.
HEARTBEAT_S = 20
GRACE_S = 90

optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own line per trial


class StudyError(Exception):
    """The storage or study cannot be used as asked; the message says why and what to do."""


def open_storage(spec: str):
    """An Optuna storage: an RDB URL (sqlite:///path, postgresql://..., mysql://...) or a journal file's path."""
    try:
        if "://" in spec:
            # SQLite: wait for another process's write instead of failing after pysqlite's default 5 s.
            engine = {"connect_args": {"timeout": 60}} if spec.startswith("sqlite") else None
            with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(spec, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_S,
                                  grace_period=GRACE_S)
        return JournalStorage(JournalFileBackend(spec))
    except Exception as e:  # SQLAlchemy, driver and file errors alike
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StudyError(f"--storage {spec} cannot be opened ({reason[:300]})") from None


def existing_study(storage, name: str, plan) -> "optuna.Study | None":
    """The study `name` if the storage has it; a StudyError if it was made with another plan. Changes nothing."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None
    except Exception as e:
        raise StudyError(f"the study {name} cannot be read from its storage ({str(e).strip()[:300]})") from None
    theirs = study.user_attrs.get("plan")
    if theirs is not None and theirs != plan.canonical():
        raise StudyError(f"the study {name} exists with another search space ({study.user_attrs.get('plan_text')}; "
                         f"this command's: {plan.describe()}). Start a new study with another --name, or delete the "
                         f"old one (its folder, or `optuna delete-study --study-name {name} --storage URL`)")
    return study


def create_study(storage, name: str, plan, attrs: dict):
    """A new study `name` for `plan` (or the one another process created a moment ago: the same values)."""
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
    if study.user_attrs.get("plan") is None:
        for key, value in {"plan": plan.canonical(), "plan_text": plan.describe(), **attrs}.items():
            study.set_user_attr(key, value)
    return study


def ask(study):
    """study.ask(), which takes a waiting trial first; the heartbeat is kept by the worker that runs it
    (worker.py), where Optuna would keep it in study.optimize, whence its warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")
        return study.ask()


def sampler_for(name: str, number: int):
    """Optuna's TPE sampler, seeded by the study and trial: a sweep of one worker samples the same settings when
    it is run again from scratch, and processes that ask at the same moment never sample the same ones."""
    return optuna.samplers.TPESampler(seed=zlib.crc32(f"{name}/{number}".encode()))


def pruner(settings: int, epochs: int | None):
    """Optuna's median pruner: once a fifth of the settings (2 to 5) have completed, a trial whose best val/acc
    so far is below the median of theirs at the same epoch stops. Not in the first third of the epochs (at
    least the first): early in a schedule's warm-up the order of the trials says little."""
    return optuna.pruners.MedianPruner(n_startup_trials=min(5, max(2, settings // 5)),
                                       n_warmup_steps=max(1, (epochs or 3) // 3))


def lock_sqlite(spec: str):
    """An SQLite study serves one sweep process (with its workers): a second one on it is refused.

    Optuna takes a waiting trial with a read, then a write; pysqlite runs the read outside the write's
    transaction, so two processes could both take the same trial. Journal files (a lock) and database servers
    (SELECT ... FOR UPDATE) do not let that happen; within one sweep process only the coordinator takes trials.
    """
    if not spec.startswith("sqlite:///"):
        return None
    path = Path(spec[len("sqlite:///"):])
    handle = open(path.with_name(path.name + ".lock"), "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise StudyError(f"another sweep.py is running the study in {path}. SQLite serves one sweep process at a "
                         f"time (its --parallel workers included); for several, give each --storage with a journal "
                         f"file (a path) or a database server (postgresql://...)") from None
    return handle


# --- what a trial is ------------------------------------------------------------------------------------

def surplus(t) -> bool:
    return t.state == TrialState.FAIL and "surplus" in t.user_attrs


def interrupted(t) -> bool:
    """Stopped before it finished: by a signal, or failed by Optuna's heartbeat check (which leaves no reason:
    a failed trial's attributes can no longer be set). Every other failure records its `error`."""
    return t.state == TrialState.FAIL and "error" not in t.user_attrs and "surplus" not in t.user_attrs


def holds_slot(t) -> bool:
    """Whether the trial ran, runs or will run its slot (an interrupted one leaves it to be run again)."""
    return not surplus(t) and not interrupted(t)


def slot(t) -> tuple | None:
    attrs = t.user_attrs
    return (attrs["setting"], attrs["seed_index"]) if "setting" in attrs else None


def fresh(t) -> bool:
    """A trial that sampled a new setting (or, not yet claimed, may be about to)."""
    return not surplus(t) and ("setting" not in t.user_attrs or t.user_attrs["setting"] == t.number)


def setting_params(t) -> dict:
    return dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))


def claim(trials: list, trial, grid: bool, settings: int) -> str | None:
    """Why `trial` (just taken from the queue, or new) must not run, or None if it is its slot's to run.

    `trials` is the study's trials as read after `trial` was created: all lower numbers are in it.
    """
    earlier = [t for t in trials if t.number < trial.number]
    if "setting" in trial.user_attrs:  # enqueued: a grid point, a seed of a setting, a trial run again
        mine = slot(trial)
        if any(holds_slot(t) and slot(t) == mine for t in earlier):
            return f"trial {next(t.number for t in earlier if holds_slot(t) and slot(t) == mine)} has its slot"
        return None
    if grid:
        return "every grid setting was taken"
    if sum(fresh(t) for t in earlier) >= settings:
        return f"the study had its {settings} settings"
    return None


def work_left(trials: list, grid: bool, settings: int) -> bool:
    """Whether a slot is waiting, or (sampling) fewer than `settings` settings were sampled."""
    if any(t.state == TrialState.WAITING for t in trials):
        return True
    return not grid and sum(fresh(t) for t in trials) < settings


def missing_slots(trials: list, points: list[dict] | None, seeds: list[int]) -> list[tuple[dict, dict]]:
    """The (params, user attributes) of the slots no trial holds: for a grid, every point and seed; when
    sampling, the other seeds of each completed setting, and an interrupted setting's seeds again."""
    held = {slot(t) for t in trials if holds_slot(t) and slot(t) is not None}
    if points is not None:
        wanted = [(i, k, p) for i, p in enumerate(points) for k in range(len(seeds))]
    else:
        settings = {}
        for t in sorted(trials, key=lambda t: t.number):
            if slot(t) is not None and not surplus(t):
                settings.setdefault(t.user_attrs["setting"], setting_params(t))
        completed = {slot(t)[0] for t in trials if t.state == TrialState.COMPLETE and slot(t) and slot(t)[1] == 0}
        wanted = [(s, k, p) for s, p in settings.items()
                  for k in (range(len(seeds)) if s in completed else [0])]
    return [(params, {"setting": s, "seed_index": k, "seed": seeds[k]}) for s, k, params in wanted
            if (s, k) not in held]


def enqueue_missing(study, points: list[dict] | None, seeds: list[int]) -> int:
    missing = missing_slots(study.get_trials(deepcopy=False), points, seeds)
    for params, attrs in missing:
        study.enqueue_trial(params, user_attrs=attrs)
    return len(missing)


# --- trials whose process is gone ------------------------------------------------------------------------


def mark(study, trial_number: int, key: str, reason: str) -> bool:
    """Fail a running trial with `key` (error or interrupted) = reason; False if it had ended meanwhile."""
    trial_id = next((t._trial_id for t in study.get_trials(deepcopy=False) if t.number == trial_number), None)
    try:
        optuna.Trial(study, trial_id).set_user_attr(key, reason)
        study.tell(trial_number, state=TrialState.FAIL)
        return True
    except (RuntimeError, ValueError):  # UpdateFinishedTrialError and tell's "already finished"
        return False


def recover(study) -> list[int]:
    """Mark interrupted the running trials whose process is gone: on this machine, a dead pid; elsewhere, a
    heartbeat too old (RDB storages). They run again (enqueue_missing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    host = socket.gethostname()
    gone = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        where, _, pid = t.user_attrs.get("worker", "").rpartition(":")
        if where == host and pid.isdigit() and not alive(int(pid)):
            if mark(study, t.number, "interrupted", "its process ended before it finished"):
                gone.append(t.number)
    return gone
@contextlib.contextmanager
def heartbeat(study, trial_id: int):
    """Optuna's heartbeat for the trial while it runs (RDB storages), as study.optimize keeps one."""
    storage = study._storage
    interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
    if not interval:
        yield
        return
    done = threading.Event()

    def beat():
        while True:
            storage.record_heartbeat(trial_id)
            if done.wait(interval):
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


