"""`python sweep.py [sweep options] TRAIN.PY OPTIONS`: many train.py command lines as one Optuna study.

    python sweep.py --model mlp --data fashion_mnist --space configs/sweeps/mlp.yaml --trials 24 --parallel 2
    python sweep.py --model cnn --grid "model.optimizer.lr=0.02,0.05,0.1" --seeds 3
    python sweep.py --model mlp --seeds 5                     # one setting, five seeds: mean ± std
    python sweep.py ... --storage /shared/sweeps/lr.journal   # several machines fill one study

Every option that is not the sweep's own is train.py's: a trial is that command line plus the trial's
settings and `--seed_everything`, and `python train.py` with them runs it again exactly. The study, one
TensorBoard run per trial, summary.csv and best.yaml go to `lightning_logs/sweeps/NAME/`; the same command
again continues the study. The pieces: options.py (the sweep's command line), space.py (what varies),
study.py (the Optuna study and which trial runs what), pool.py and worker.py (the processes that run trials),
summary.py (what is reported). This module runs a sweep from start to end.
"""

import os
import shlex
import signal
import socket
import sys
import time
from pathlib import Path

from experiments import study as studies
from experiments.options import DEFAULT_TRIALS, SweepError, check_variants, default_name, make_plan, parse_options
from experiments.pool import Pool
from experiments.space import Plan, override, short_names
from experiments.summary import report, setting_text, shown_path

SIGNAL_NAMES = {signal.SIGINT: ("Ctrl-C", 130), signal.SIGTERM: ("SIGTERM", 143)}


class Interrupted(Exception):
    """A signal arrived before any trial ran."""


class Sweep:
    """One sweep process: checks the command, opens the study, hands trials to workers, reports."""

    def __init__(self, opts, plan: Plan, train_argv: list[str]):
        self.opts, self.plan, self.train_argv = opts, plan, train_argv
        self.keys = [p.key for p in plan.params]
        self.names = short_names(self.keys)
        self.pool = Pool()
        self.signals: list[int] = []
        self.study = None

    # --- before any trial ----------------------------------------------------------------------------

    def wait_for(self, worker) -> dict:
        """The reply of `worker` to its request; Interrupted on a signal."""
        while True:
            for w, reply in self.pool.wait(0.5):
                if w is worker:
                    w.job = None
                    if reply is None:
                        raise SweepError(f"{w.exit_reason()} while checking the trial command line", 1)
                    return reply
            if self.signals:
                raise Interrupted

    def check(self) -> dict:
        """train.py's verdict on the trial command line (every param's extremes), from a worker."""
        variants = check_variants(self.plan, self.train_argv)
        worker = self.pool.workers[0]
        self.pool.request(worker, ("check", [argv for argv, _ in variants]), {})
        info = self.wait_for(worker)
        if info.get("error"):
            label = variants[info["variant"]][1]
            where = f" with {label}" if label else ""
            raise SweepError(f"the trial command line{where} is not valid for train.py: {info['error']}", info["code"])
        if self.plan.seeds > 1 and (isinstance(info["seed"], bool) or not isinstance(info["seed"], int)):
            raise SweepError("--seeds needs an integer --seed_everything to count from")
        if self.opts.per_gpu and not info["gpus"]:
            raise SweepError("--per_gpu: train.py sees no GPU here (use --parallel on CPUs)")
        return info

    def open_early(self) -> None:
        """A --storage given, and a --name: both checked before anything else, and nothing is written."""
        self.storage = studies.open_storage(self.opts.storage) if self.opts.storage else None
        if self.storage is not None and self.opts.name:
            studies.existing_study(self.storage, self.opts.name, self.plan)

    def open(self, info: dict) -> None:
        """The study (created if new) and the sweep's folder."""
        opts, plan = self.opts, self.plan
        self.name = opts.name or default_name(info, opts, plan, self.train_argv)
        self.dir = (Path(info["save_dir"]) / "sweeps" / self.name).resolve()
        self.storage_spec = opts.storage or f"sqlite:///{self.dir / 'study.db'}"
        if self.storage is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.storage = studies.open_storage(self.storage_spec)
        self.lock = studies.lock_sqlite(self.storage_spec)
        study = studies.existing_study(self.storage, self.name, plan)
        seeds = [info["seed"] + i for i in range(plan.seeds)] if plan.seeds > 1 else [info["seed"]]
        if study is None:
            trials = self.dir / "trials"
            if trials.is_dir() and any(trials.iterdir()):
                raise SweepError(f"{shown_path(self.dir)} holds the trials of an earlier study that is not in "
                                 f"{self.storage_spec}; delete that folder or choose another --name")
            study = studies.create_study(self.storage, self.name, plan, {"seeds": seeds, "command": self.train_argv})
        elif study.user_attrs.get("command") not in (None, self.train_argv):
            print(f"Note: the study {self.name} was started with another train.py command "
                  f"({shlex.join(study.user_attrs['command'])}); each trial's own command is in summary.csv.")
        self.study = study
        self.seeds = study.user_attrs.get("seeds", seeds)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.info = info
        self.points = plan.points() if plan.grid else None
        self.settings = len(self.points) if plan.grid else (opts.trials or DEFAULT_TRIALS)

    # --- handing out trials ----------------------------------------------------------------------------

    def next_job(self, worker, threads: int) -> dict | None:
        """Take the next trial for `worker` (see study.py for the rules), or None if there is none."""
        study, plan = self.study, self.plan
        while True:
            if not studies.work_left(study.get_trials(deepcopy=False), plan.grid, self.settings):
                return None
            trial = studies.ask(study)
            reason = studies.claim(study.get_trials(deepcopy=False), trial, plan.grid, self.settings)
            if reason is not None:
                trial.set_user_attr("surplus", reason)
                study.tell(trial, state=studies.TrialState.FAIL)
                continue
            attrs = dict(trial.user_attrs)
            if "setting" not in attrs:  # a new setting, sampled with a sampler seeded by the trial's number
                study.sampler = studies.sampler_for(self.name, trial.number)
                attrs.update(setting=trial.number, seed_index=0, seed=self.seeds[0])
            params = {p.key: suggest(trial, p) for p in plan.params}
            return self.job(trial, params, attrs, worker, threads)

    def job(self, trial, params: dict, attrs: dict, worker, threads: int) -> dict:
        n = trial.number
        overrides = [override(k, v) for k, v in params.items()]
        command = [*self.train_argv, *overrides, override("seed_everything", attrs["seed"])]
        # On a CPU, float sums depend on the number of threads: the trial's command says how many it had.
        threads_env = [] if self.info["gpus"] else [f"OMP_NUM_THREADS={threads}"]
        attrs.update(overrides=overrides, command=shlex.join([*threads_env, "python", "train.py", *command]),
                     worker=f"{socket.gethostname()}:{worker.pid}")
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        # Where the trial writes, and no progress bar in its log: bookkeeping, not part of what it trains.
        argv = [*command, f"--trainer.logger.init_args.save_dir={self.dir}", "--trainer.logger.init_args.name=trials",
                f"--trainer.logger.init_args.version=trial_{n:04d}", "--trainer.enable_progress_bar=false"]
        if self.info["gpus"]:
            argv.append(f"--trainer.devices=[{worker.index % self.info['gpus']}]")
        return {"trial_id": trial._trial_id, "number": n, "argv": argv, "threads": threads,
                "prune": not self.plan.grid and attrs["seed_index"] == 0,
                "log": str(self.dir / "logs" / f"trial_{n:04d}.log"),
                "storage": self.storage_spec, "study": self.name, "settings": self.settings,
                "epochs": self.info["max_epochs"], "params": params,
                "seed": attrs["seed"], "seed_index": attrs["seed_index"]}

    def workers_wanted(self) -> int:
        trials = self.study.get_trials(deepcopy=False)
        waiting = sum(t.state == studies.TrialState.WAITING for t in trials)
        new = 0 if self.plan.grid else max(0, self.settings - sum(studies.fresh(t) for t in trials))
        gpus = self.info["gpus"]
        n = self.opts.per_gpu * gpus if self.opts.per_gpu else (self.opts.parallel or gpus or 1)
        return max(1, min(n, waiting + new * self.plan.seeds))

    def run(self) -> int:
        """Run trials until the study has all it needs; the exit code."""
        study = self.study
        gone = studies.recover(study)
        if gone:
            print(f"{'Trials' if len(gone) > 1 else 'Trial'} {', '.join(map(str, gone))} "
                  f"{'were' if len(gone) > 1 else 'was'} running when an earlier sweep stopped: run again.")
        studies.enqueue_missing(study, self.points, self.seeds)
        if not studies.work_left(study.get_trials(deepcopy=False), self.plan.grid, self.settings):
            print(f"Nothing to run: the study {self.name} has all its trials.")
            return self.finish(None, None)
        n = self.workers_wanted()
        self.pool.shrink(n)  # workers started early, for more trials than there are left
        self.pool.start(n - len(self.pool.workers))
        threads = max(1, len(os.sched_getaffinity(0)) // n)
        devices = f"{self.info['gpus']} GPU(s)" if self.info["gpus"] else f"{threads} CPU thread(s) each"
        print(f"Sweep {self.name} ({self.plan.describe()}): {n} worker(s), {devices}; study in "
              f"{self.storage_spec}; trial logs in {shown_path(self.dir / 'logs')}/", flush=True)
        stopping, fatal, crashes, last_recover = None, None, 0, time.monotonic()
        while True:
            if stopping is None:
                for w in self.pool.idle():
                    job = self.next_job(w, threads)
                    if job is None:
                        break
                    self.pool.request(w, ("trial", job), job)
            if not self.pool.busy():
                break
            for w, reply in self.pool.wait(1.0):
                job, w.job = w.job, None
                if reply is None:
                    if job:
                        crashes += 1
                        reason = w.exit_reason()
                        key = "interrupted" if stopping else "error"
                        studies.mark(study, job["number"], key, f"{reason} while running it")
                        self.progress(job, {"state": "interrupted" if stopping else "failed", "error": reason})
                    if stopping is None:
                        if crashes >= 3:
                            fatal = (f"{crashes} trials in a row ended with their worker process ({reason}); "
                                     f"see {self.dir / 'logs'}", 1)
                            stopping = "error"
                            self.pool.signal(signal.SIGTERM)
                        else:
                            self.pool.start()
                    continue
                crashes = 0
                self.progress(job, reply)
                if reply.get("fatal") and stopping is None:
                    fatal = (f"trial {job['number']}'s command line is not valid for train.py: {reply['error']}", 2)
                    stopping = "error"
                    self.pool.signal(signal.SIGTERM)
                elif reply["state"] in ("complete", "interrupted") and stopping is None:
                    studies.enqueue_missing(study, self.points, self.seeds)  # more seeds, or the slot again
            if self.signals and stopping is None:
                stopping = self.signals[0]
                print(f"\nStopping: the running trials stop after their current step and are run again by the "
                      f"same command ({SIGNAL_NAMES[stopping][0]} again stops at once) ...",
                      file=sys.stderr, flush=True)
                self.pool.signal(signal.SIGTERM)
            elif len(self.signals) > 1 and stopping is not None:
                for w in self.pool.busy():
                    w.process.kill()
            if time.monotonic() - last_recover > studies.GRACE_S:  # machines elsewhere that died
                last_recover = time.monotonic()
                studies.recover(study)
                studies.enqueue_missing(study, self.points, self.seeds)
        self.pool.close()
        print()
        return self.finish(stopping, fatal)

    def finish(self, stopping: int | None, fatal: tuple | None) -> int:
        """Report the study (summary.csv, best.yaml, the table); the exit code."""
        text, settings_done = report(self.study, self.keys, self.dir, self.info["plumbing"], self.name)
        print(text, flush=True)
        if fatal:
            raise SweepError(*fatal)
        if stopping is not None:
            name, code = SIGNAL_NAMES[stopping]
            print(f"sweep.py: stopped by {name}; the same command continues the study.", file=sys.stderr)
            return code
        if not settings_done:
            raise SweepError("no trial completed (their errors are above; each trial's log is in "
                             f"{shown_path(self.dir / 'logs')}/)", 1)
        return 0

    def progress(self, job: dict, reply: dict) -> None:
        what = f"trial {job['number']} ({setting_text(job['params'], self.names)}, seed {job['seed']})"
        state, results = reply["state"], reply.get("results") or {}
        if state == "complete":
            detail = (f"val/acc_best {results['val/acc_best']:.4f} after {results['epochs']} epochs, "
                      f"fit {results['fit_seconds']:.1f} s")
        elif state == "pruned":
            detail = f"pruned after epoch {reply['pruned_epoch'] + 1} (val/acc_best {results['val/acc_best']:.4f})"
        else:
            detail = f"{state}: {reply.get('error')}"
        print(f"{what}: {detail}", flush=True)


def suggest(trial, p):
    """The trial's value of `p`: sampled, or the enqueued one (Optuna's suggest returns fixed values)."""
    if p.kind == "float":
        return trial.suggest_float(p.key, p.low, p.high, log=p.log, step=p.step)
    if p.kind == "int":
        return trial.suggest_int(p.key, int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return trial.suggest_categorical(p.key, list(p.choices))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sweep = None
    handlers = {signum: signal.getsignal(signum) for signum in SIGNAL_NAMES}
    try:
        opts, train_argv = parse_options(argv)
        plan = make_plan(opts)
        sweep = Sweep(opts, plan, train_argv)
        for signum in SIGNAL_NAMES:  # a flag only: the loop stops the workers' trials, then reports
            signal.signal(signum, lambda signum, frame: sweep.signals.append(signum))
        sweep.pool.wake_on_signals()
        sweep.open_early()
        # All the workers that will surely be wanted, now: their imports (seconds each) run side by side.
        sweep.pool.start(opts.parallel or opts.per_gpu or 1)
        info = sweep.check()
        sweep.open(info)
        return sweep.run()
    except SweepError as e:
        print(f"sweep.py: error: {e}", file=sys.stderr)
        return e.code
    except studies.StudyError as e:
        print(f"sweep.py: error: {e}", file=sys.stderr)
        return 2
    except Interrupted:
        name, code = SIGNAL_NAMES[sweep.signals[0]]
        print(f"sweep.py: stopped by {name} before any trial ran", file=sys.stderr)
        return code
    finally:
        if sweep is not None:
            sweep.pool.close()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
