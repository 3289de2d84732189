"""A sweep's worker process: it imports train.py's code once and runs trials one after another, in-process.

The coordinator (experiments/pool.py) sends it requests over a pipe and gets one reply each:
  ("check", variants)  parse every variant of the trial command line as train.py would, build the first
                       (with fast_dev_run, which writes nothing), and say what it found or what is wrong
  ("trial", job)       run one trial: `cli.main.run` with the trial's command line, reporting each epoch's
                       val/acc to its Optuna trial, and record how it ended in the study
  ("exit",)            end

A trial's exception, NaN loss or bad option ends that trial (failed, with train.py's one-line reason), never
the worker. Data sets stay in this process between trials (datamodules/base.py's memo), so only the first
trial of a worker reads them. A worker dies with its coordinator (SIGTERM when it goes) and sits in a process
group of its own, so that Ctrl-C reaches the coordinator, which stops the workers' trials cleanly.
"""

import contextlib
import ctypes
import gc
import os
import signal
import sys
import threading
import traceback

PR_SET_PDEATHSIG = 1


def serve(conn) -> None:
    """The worker's loop: replies to the coordinator's requests until told to exit or the pipe closes."""
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the coordinator went before the line above took effect
        return
    os.setpgrp()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())  # between trials: end after the reply
    sys.argv = ["train.py"]  # LightningCLI warns when sys.argv (the coordinator's) and its args both carry options
    worker = Worker(stop)
    while not stop.is_set():
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request[0] == "exit":
            break
        reply = worker.check(request[1]) if request[0] == "check" else worker.trial(request[1])
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
    # Every trial's files are closed and its results in the study: skip the interpreter's teardown of torch and
    # Lightning (2 s of a sweep's end on a small CPU).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def die_with_parent() -> None:
    """Ask Linux for SIGTERM when the coordinator dies (even by kill -9): the running trial stops cleanly."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a worker whose coordinator died ends after its trial
        pass


class Worker:
    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.studies = {}
        from cli import main  # the ~4 s of imports every train.py process pays, paid once per worker

        self.cli = main

    # --- checking the command line ---------------------------------------------------------------------

    def check(self, variants: list[list[str]]) -> dict:
        """Parse each variant as train.py does and build the first: {"error", "code", "variant"} or what it is."""
        from cli import app
        from cli.args import UsageError, expand_short_names, split_stage

        with output_to(os.devnull):
            try:
                cli = None
                for i, argv in enumerate(variants):
                    stage, argv = split_stage(argv)
                    if stage != "fit":
                        raise UsageError(f"a sweep runs `fit` trials, not `{stage}`")
                    if cli is None:
                        cli = app.TrainCLI(expand_short_names(argv + ["--trainer.fast_dev_run=true"]), "fit")
                        info = self.describe(cli)
                    else:
                        cli.parse_arguments(cli.parser, expand_short_names(argv))
            except BaseException as e:
                code, message = self.error(e)
                if code is None:
                    message += "\n" + traceback.format_exc()
                return {"error": message, "code": code or 1, "variant": i}
        ckpt, multi = info.pop("ckpt_path"), info.pop("multi")
        problem = ("trials start from scratch: leave out --ckpt_path" if ckpt else
                   "a sweep chooses settings on val/acc_best, and --data.val_size 0 leaves no validation set"
                   if not info["has_validation"] else
                   "a trial runs on one device: leave out --trainer.devices / --trainer.num_nodes" if multi else None)
        return {"error": problem, "code": 2, "variant": 0} if problem else info

    @staticmethod
    def describe(cli) -> dict:
        import torch

        from cli.app import logger_init_args

        config, trainer = cli.config, cli.config["trainer"]
        logger = logger_init_args(trainer.get("logger"))
        devices = trainer.get("devices")
        accelerator = str(trainer.get("accelerator"))
        return {
            "model": cli.model.hparams.arch, "data": cli.datamodule.name, "seed": config["seed_everything"],
            "has_validation": cli.datamodule.has_validation, "ckpt_path": config.get("ckpt_path"),
            "multi": devices not in ("auto", 1, "1", None) and not (isinstance(devices, list) and len(devices) == 1)
            or (trainer.get("num_nodes") or 1) > 1,
            "gpus": torch.cuda.device_count() if accelerator in ("auto", "gpu", "cuda") else 0,
            "save_dir": logger.get("save_dir") or "lightning_logs", "max_epochs": trainer.get("max_epochs"),
            # What the sweep sets in each trial for its own bookkeeping, as this command had it (best.yaml).
            "plumbing": {"save_dir": logger.get("save_dir"), "name": logger.get("name"),
                         "version": logger.get("version"),
                         "enable_progress_bar": trainer.get("enable_progress_bar"), "devices": devices},
        }

    def error(self, e: BaseException) -> tuple[int | None, str]:
        """train.py's exit code and one-line message for an exception (cli/main.py's main() maps the same);
        (None, text) for one it does not expect (a bug: the caller adds the traceback)."""
        main = self.cli
        if isinstance(e, main.Stopped):
            return e.exit_code, str(e)
        if isinstance(e, KeyboardInterrupt):
            return 130, "stopped by Ctrl-C"
        known = main.user_error(e) if isinstance(e, Exception) else None
        if known is not None:
            return known
        return None, f"{type(e).__name__}: {main.first_line(e)}"

    # --- running a trial -------------------------------------------------------------------------------

    def trial(self, job: dict) -> dict:
        """Run the trial `job` describes and record its end in the study; the reply says how it ended."""
        import optuna
        import torch
        from optuna.trial import TrialState

        from experiments.reporter import TrialReporter
        from experiments.study import heartbeat, open_storage, pruner

        torch.set_num_threads(job["threads"])
        key = (job["storage"], job["study"])
        if key not in self.studies:
            self.studies[key] = optuna.load_study(study_name=job["study"], storage=open_storage(job["storage"]),
                                                  sampler=optuna.samplers.RandomSampler(),
                                                  pruner=pruner(job["settings"], job["epochs"]))
        study = self.studies[key]
        trial = optuna.Trial(study, job["trial_id"])
        reporter = TrialReporter(trial, job["prune"], job["params"])
        reply = {"number": job["number"]}
        with output_to(job["log"]), heartbeat(study, job["trial_id"]):
            try:
                if self.stop.is_set():
                    raise self.cli.Stopped("stopped by SIGTERM before it started", 143)
                record = self.cli.run(job["argv"], callbacks=(reporter,))
            except BaseException as e:
                code, message = self.error(e)
                if code is None:
                    traceback.print_exc()
                print(f"sweep.py: trial {job['number']}: {message}", file=sys.stderr)
                stopped = isinstance(e, (self.cli.Stopped, KeyboardInterrupt))
                if stopped:  # the sweep runs it again: train.py's advice on resuming it is not for here
                    self.stop.set()
                    message = message.split(";")[0]
                reply.update(state="interrupted" if stopped else "failed", error=message, fatal=code == 2)
                trial.set_user_attr("interrupted" if stopped else "error", message)
                study.tell(trial, state=TrialState.FAIL)
                return reply
        results = {k: record.get(k) for k in ("val/acc_best", "test/acc", "epochs", "fit_seconds", "seed", "log_dir")}
        trial.set_user_attr("results", results)
        reply.update(results=results)
        if reporter.pruned_epoch is not None:
            trial.set_user_attr("pruned_epoch", reporter.pruned_epoch)
            study.tell(trial, state=TrialState.PRUNED)
            reply.update(state="pruned", pruned_epoch=reporter.pruned_epoch)
        else:
            study.tell(trial, results["val/acc_best"])
            reply.update(state="complete")
        gc.collect()  # the trial's trainer, model and device copies of the data, before the next trial
        return reply


@contextlib.contextmanager
def output_to(path: str):
    """Everything the process writes to stdout and stderr (Lightning's, C libraries' too) goes to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
