"""A sweep's study, on Optuna's documented pattern for many processes. This process checks the
command lines and prepares the study: a grid's settings enqueued once (a second start adds
nothing). Then it and its worker processes each run `study.optimize` on the shared RDB storage,
which hands each waiting trial to one of them (optuna/optuna#1014, #2925); heartbeats fail a
killed worker's trial, and RetryHeartbeatStaleTrialCallback queues it again. A trial trains its
setting with train.py's TrainCLI in the worker's own process, once per seed. Then the table,
summary.csv and best.yaml, from the study: the same on every machine."""

import fcntl
import hashlib
import itertools
import multiprocessing
import signal
import sys
import warnings
from pathlib import Path

import jsonargparse
import optuna
import sqlalchemy
import yaml
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from optuna_integration import PyTorchLightningPruningCallback

from lit_cli.errors import Stopped, UsageError, explain

# The trials that count among those asked for: running ones too, so that workers that end at
# once start none past them.
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
LOAD = jsonargparse.get_loader("yaml")
# Optuna's log, in this process and each worker: a failed trial's line is the sweep's own, not
# Optuna's warning with its traceback.
optuna.logging.set_verbosity(optuna.logging.ERROR)


def sweep(opts, cli) -> int:
    """The sweep of `opts` (sweep.py's options), its runs made by `cli` (train.py's TrainCLI):
    the command lines checked, the study prepared, its workers run, the summary. Its exit code."""
    opts.sampled = bool(opts.space)
    opts.space = read_space(opts.space) if opts.sampled else grid_space(opts.grid)
    opts.seed = check(opts, cli)
    # The default name is the command's: the same command finds its study again.
    opts.command = repr([vars(opts)[key] for key in ("train", "space", "seeds", "objective",
                                                     "direction")])
    opts.name = opts.name or "sweep-" + hashlib.sha1(opts.command.encode()).hexdigest()[:8]
    opts.folder = Path("lightning_logs", "sweeps", opts.name).resolve()
    opts.folder.mkdir(parents=True, exist_ok=True)
    opts.storage = opts.storage or study_url(opts.folder)
    study = prepare(opts)
    trials = study.get_trials(deepcopy=False)
    # The trials asked for (a grid's settings); a trial stopped or killed, and its retry, are one.
    opts.budget = opts.trials + sum("failed_trial" in t.system_attrs for t in trials)
    left = sum(t.state == TrialState.WAITING for t in trials) + max(0, opts.budget - len(trials))
    print(f"Sweep {opts.name}: {left} trials to run; study in {opts.storage}", flush=True)
    return finish(study, opts, run_workers(opts, cli, min(opts.parallel, left)))


def check(opts, cli) -> int:
    """What Optuna or train.py refuses, refused before any trial (the space, and the command of a
    setting of it); and runs that hold out no validation split, or an objective of test data (a
    sweep never ranks settings on test data). The runs' first seed."""
    built = cli([*opts.train, *sample(opts.space), "--trainer.logger=false"], run=False)
    if getattr(built.datamodule, "has_validation", 1) is False or opts.objective.startswith("test"):
        raise UsageError("a sweep ranks by validation, never test data: add --data.val_size 5000")
    return built.config.seed_everything


def study_url(folder: Path) -> str:
    """The SQLite URL of the study in `folder`, its path escaped: a name may hold '?' or '#'."""
    return sqlalchemy.URL.create("sqlite", database=str(folder / "study.db")).render_as_string()


def storage(url: str, heartbeat: int) -> RDBStorage:
    """The study's storage, with heartbeats: a trial whose worker died (SIGKILL, a lost machine)
    fails after three silent intervals, and runs again (twice at most) when a sweep goes on."""
    # Heartbeats, their retries and fail_stale_trials are experimental in Optuna: used knowingly.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        return Storage(url, heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                       heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(2))
    except (ValueError, sqlalchemy.exc.SQLAlchemyError) as e:
        reason = str(e.__cause__ or e).strip().splitlines()[0]
        raise UsageError(f"--storage {url}: cannot open it ({reason})") from None


class Storage(RDBStorage):
    """Optuna's RDBStorage, whose waiting trials go to one worker each in an SQLite file too:
    SQLite has no `SELECT ... FOR UPDATE`, and two workers took one trial (optuna/optuna#4002,
    and Optuna's FAQ; a database server has it). There the take is made under a lock of a file
    beside the study's, which the system gives back where a worker dies."""

    def set_trial_state_values(self, trial_id: int, state: TrialState, values=None) -> bool:
        """RDBStorage's; a waiting trial's take in SQLite (Study.ask), under the lock."""
        if state != TrialState.RUNNING or not self.url.startswith("sqlite"):
            return super().set_trial_state_values(trial_id, state, values)
        with open(f"{sqlalchemy.make_url(self.url).database}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # until the file closes
            return super().set_trial_state_values(trial_id, state, values)


def prepare(opts) -> optuna.Study:
    """The study, made if new (a study another command made is refused); a grid's settings
    enqueued once, and the trials of workers that died queued again."""
    study = optuna.create_study(study_name=opts.name, storage=storage(opts.storage, opts.heartbeat),
                                direction=opts.direction, load_if_exists=True)
    made = study.user_attrs.get("command", opts.command)
    if made != opts.command:  # its trials would be ranked with another command's
        raise UsageError(f"the study {opts.name} was made by another command (its train.py "
                         f"options, space, seeds and objective: {made}); choose another --name")
    study.set_user_attr("command", opts.command)
    if not opts.sampled:  # a grid, or one setting: each point a trial
        opts.trials = len(points := list(itertools.product(*opts.space.values())))
        for point in points:
            study.enqueue_trial(dict(zip(opts.space, point)), {"grid": True}, skip_if_exists=True)
    optuna.storages.fail_stale_trials(study)
    return study


def run_workers(opts, cli, n: int) -> list[int]:
    """The exit codes of `n` workers, this process and `n - 1` processes of their own; the first
    is this process's."""
    context = multiprocessing.get_context("forkserver")
    # Forked from a server that imported these once: spawned, each worker would import them again
    # (seconds of CPU); forked from this process, it would inherit its state and threads.
    context.set_forkserver_preload(["torch", "lightning.pytorch", "optuna"])
    workers = [context.Process(target=work_alone, args=(opts, cli, i)) for i in range(1, n)]
    for worker in workers:
        worker.start()
    # This process's worker passes the signals it takes on to the others, to their end (one that
    # comes after its own trials is in its objective's `stop`); then its handlers are set back.
    objective = Objective(opts, cli, workers)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    codes = [work(opts, objective) for _ in range(min(n, 1))]
    for worker in workers:
        worker.join()
    for s, handler in previous.items():
        signal.signal(s, handler)
    return [*codes, objective.stop, *(worker.exitcode for worker in workers)]


def work_alone(opts, cli, index: int) -> None:
    """A worker process; its exit code is work's."""
    sys.exit(work(opts, Objective(opts, cli, [], index)))


def work(opts, objective: "Objective") -> int:
    """`study.optimize` on the shared storage, until the study has what the sweep asked for or
    a signal stops it (`objective.note` handles both). The exit code: 0; 2 where the runs log
    no objective; 130 or 143 where a signal stopped it."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, objective.note)
    study = optuna.load_study(study_name=opts.name, storage=storage(opts.storage, opts.heartbeat),
                              pruner=optuna.pruners.MedianPruner(4, n_warmup_steps=2))
    # TPE seeded by the runs' seed, the worker and the trials so far: a sweep samples as it did,
    # each worker other settings, and a sweep that goes on new ones.
    seed = opts.seed + objective.index + opts.parallel * len(study.trials)
    study.sampler = optuna.samplers.TPESampler(seed=seed)
    budget = optuna.study.MaxTrialsCallback(opts.budget, states=COUNTED)
    try:  # none past the budget, from the first trial on
        if len(study.get_trials(deepcopy=False, states=COUNTED)) < opts.budget:
            study.optimize(objective, catch=(Failed,), callbacks=[budget])
    except Stopped as e:
        return e.exit_code
    except UsageError:
        return 2
    return objective.stop


class Failed(Exception):
    """A run of a trial failed (train.py's one line): the trial fails, the sweep goes on."""


class Objective:
    """Optuna's objective of a sweep (`opts`: sweep.py's options, as `sweep` completes them): a
    trial's setting trained once per seed by `cli`, its value the mean of the runs' objective;
    and the stops of the worker, which passes them on to `workers`."""

    def __init__(self, opts, cli, workers: list, index: int = 0):
        self.opts, self.cli, self.workers, self.index = opts, cli, workers, index
        self.stop = 0  # the exit code of a signal that asked the worker to stop

    def note(self, signum, frame) -> None:
        """The SIGINT and SIGTERM handler: the stop is noted, not raised where it lands (in a
        write to the study), and the trial stops before its next run. A fit stops after its step
        (Lightning calls this SIGTERM handler from its own; LastCheckpoint handles a Ctrl-C). A
        SIGTERM to the sweep alone is passed on to its workers (a Ctrl-C at a terminal reaches
        them all)."""
        self.stop = self.stop or 128 + signum
        for worker in self.workers:
            worker.terminate()  # a worker takes one SIGTERM, however many come

    def __call__(self, trial: optuna.Trial) -> float:
        """The mean objective of the trial's setting over the seeds; where the sweep stops, the
        trial runs again when it goes on, as a killed worker's trial does."""
        if not self.opts.sampled and "grid" not in trial.user_attrs:
            # Not one of the grid's enqueued settings: this worker asked as another (on another
            # machine) took the last one. None is left, and no other setting may run.
            trial.study.stop()
            raise optuna.TrialPruned("no setting of the grid was left")
        params = {key: suggest(trial, key, spec) for key, spec in self.opts.space.items()}
        try:
            values = [self.run(trial, params, self.opts.seed + i) for i in range(self.opts.seeds)]
        except Failed as e:
            said = ", ".join(f"{key}={value}" for key, value in params.items()) or "as given"
            print(f"trial {trial.number} ({said}): failed: {e}", file=sys.stderr, flush=True)
            trial.set_user_attr("error", str(e))
            raise
        except Stopped:
            RetryHeartbeatStaleTrialCallback()(trial.study, trial.study.trials[trial.number])
            raise
        return sum(values) / len(values)

    def run(self, trial: optuna.Trial, params: dict, seed: int) -> float:
        """The setting trained with one seed, in the trial's folder: the run's objective."""
        opts, first = self.opts, seed == self.opts.seed
        if self.stop:
            raise Stopped("stopped between runs", self.stop)
        folder = opts.folder / f"trial_{trial.number:04d}"
        folder = folder / f"seed_{seed}" if opts.seeds > 1 else folder
        # The first seed's curve prunes a sampled setting; the others only average.
        pruning = [PyTorchLightningPruningCallback(trial, monitor=opts.objective)]
        args = [*opts.train, *(f"--{key}={value}" for key, value in params.items()),
                f"--seed_everything={seed}", f"--trainer.default_root_dir={folder}",
                "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
        try:
            record = self.cli(args, callbacks=pruning * (first and opts.sampled)).record
        except (Stopped, optuna.TrialPruned):
            raise
        except (Exception, SystemExit) as e:
            if self.stop:  # broken by the stop
                raise Stopped(str(e), self.stop) from e
            raise Failed(explain(e)[1] or f"{type(e).__name__}: {e}") from e
        metrics = (record or {"metrics": {}})["metrics"]
        if metrics.get(opts.objective, 0) is None:
            raise Failed(f"{opts.objective} is NaN")
        if opts.objective not in metrics:  # the sweep ends: the line says what the runs log
            logged = ", ".join(m for m in metrics if not m.startswith(("train", "test")))
            trial.set_user_attr("error", f"the runs log no {opts.objective} (in validation: "
                                         f"{logged or 'none'}): name one with --objective")
            raise UsageError(trial.user_attrs["error"])
        if first:  # in the study, for best.yaml on every machine
            config = Path(record["log_dir"], "config.yaml").read_text()
            trial.set_user_attr("config", yaml.safe_load(config))
        return metrics[opts.objective]


def finish(study: optuna.Study, opts, codes: list[int]) -> int:
    """The table, summary.csv and best.yaml in the sweep's folder; the exit code, and a last
    line where the sweep ended short: stopped by a signal or a killed worker, runs that log no
    objective, or no trial complete."""
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params"))
    frame.to_csv(opts.folder / "summary.csv", index=False)
    print(f"Study {opts.name}: {len(frame)} trials in {opts.folder}", frame.to_string(index=False),
          sep="\n", flush=True)
    trials = study.get_trials(deepcopy=False)
    fails = [t.user_attrs["error"] for t in trials if "error" in t.user_attrs]
    stopped = [code for code in codes if code]
    last = "".join(f": {error}" for error in fails[-1:])  # the last failed trial's error
    line, code = f"error: no trial completed ({len(fails)} failed{last})", 1
    if any(t.state == TrialState.COMPLETE for t in trials):
        print(best(study.best_trial, opts), flush=True)
        line, code = None, 0
    if stopped:  # by a signal, or a worker was killed
        how, code = {130: (" by Ctrl-C", 130), 143: (" by SIGTERM", 143)}.get(stopped[0], ("", 1))
        done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
        line = (f"stopped{how} with {done} trials complete or pruned; the same command goes on "
                f"with the study")
    if 2 in stopped:  # the runs log no objective: the trial says what they log
        line, code = f"error: {fails[-1]}", 2
    if line:
        print(f"sweep.py: {line}", file=sys.stderr, flush=True)
    return code


def best(trial: optuna.trial.FrozenTrial, opts) -> str:
    """best.yaml, the best trial's config, and the line that says how to train it again."""
    config = trial.user_attrs["config"]
    config["trainer"]["default_root_dir"] = None  # a replay logs where its own command runs
    (opts.folder / "best.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    setting = ", ".join(f"{k}={v}" for k, v in trial.params.items()) or "as given"
    return (f"Best: trial {trial.number}, {opts.objective} {trial.value:.4f} ({setting}); "
            f"python train.py --config {opts.folder / 'best.yaml'}")


def read_space(path: str) -> dict:
    """{train.py option: a range {low, high[, log, step]} or a list of choices} of a file."""
    try:
        space = LOAD(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UsageError(f"--space {path}: cannot read it ({str(e).splitlines()[0]})") from None
    if not isinstance(space, dict) or not space:
        raise UsageError(f"--space {path}: write train.py options: ranges or lists of choices")
    return {str(key).lstrip("-"): spec for key, spec in space.items()}


def grid_space(items: list[str]) -> dict:
    """{train.py option: its values} of the `--grid KEY=V1,V2,...` options."""
    pairs = [item.partition("=") for item in items]
    if any(not key.lstrip("-") or "" in values.split(",") for key, _, values in pairs):
        raise UsageError("--grid: write KEY=V1,V2,... with no value empty")
    return {key.lstrip("-"): [LOAD(v) for v in values.split(",")] for key, _, values in pairs}


def sample(space: dict) -> list[str]:
    """train.py's options of a setting of the space, as Optuna samples it (floats of a float
    range: an option that takes ints refuses 40.5), where Optuna can sample each option: what it
    refuses (low above high, a log range from 0, a step that does not divide the range) is
    refused in one line that names the option."""
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(0)).ask()
    for key, spec in space.items():
        try:
            with warnings.catch_warnings():  # a step that does not divide the range: Optuna
                warnings.simplefilter("error")  # would cut the range in silence
                suggest(trial, key, spec)
        except (ValueError, TypeError, UserWarning) as e:
            raise UsageError(f"{key}: {e}") from None
    return [f"--{key}={value}" for key, value in trial.params.items()]


def suggest(trial: optuna.Trial, key: str, spec):
    """The trial's value of one option: Optuna's suggestion from its list, or from its range
    (of ints where its numbers are ints)."""
    if isinstance(spec, list):
        return trial.suggest_categorical(key, spec)
    # A range: of floats where a number is one (anything else, Optuna refuses)
    floats = isinstance(spec, dict) and any(isinstance(x, float) for x in spec.values())
    return (trial.suggest_float if floats else trial.suggest_int)(key, **spec)
