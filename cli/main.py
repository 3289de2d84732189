"""`python train.py [fit|validate|test|predict|export] ...`: run a subcommand, and turn what a user can fix into
one line and an exit code (2: the command line, 1: the data, a checkpoint, the run; 130/143: Ctrl-C/SIGTERM).
"""

import re
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from jsonargparse import ArgumentError
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from cli import app, help, results, runs
from cli.args import USAGE, UsageError, expand_short_names, option_value, split_stage, without_option
from cli.console import quiet_warnings
from datamodules import DataSetupError
from lit_models.callbacks import LastCheckpoint, TrainingSpeed
from lit_models.classifier import NonFiniteLossError
from lit_models.networks import NetworkShapeError
from lit_models.schedules import ScheduleMismatchError


class Stopped(Exception):
    """A run was stopped by a signal; the message says where, and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# What a user can fix gets one line and an exit code, no traceback (--verbose shows it anyway).
USER_ERRORS = (DataSetupError, runs.CheckpointError, NonFiniteLossError, ScheduleMismatchError)


def fit_and_test(argv: list[str], callbacks: tuple = ()) -> dict:
    """Fit, then test the best checkpoint (the last one without a validation set); write results.json."""
    with stop_on_sigterm("before training started"):
        model, data, trainer, run = app.build("fit", expand_short_names(argv), callbacks=callbacks)
    with discarded_on_failure(run, trainer):
        if trainer.is_global_zero and run.dir is not None:
            print(f"Run {run.dir} (tensorboard --logdir {run.dir.parent.parent})", flush=True)
        effective = data.effective_batch_size(trainer)
        if effective != data.batch_size and trainer.is_global_zero:
            print(f"{trainer.world_size} processes x {data.accumulate_grad_batches} accumulated x batch "
                  f"{data.batch_size} = effective batch {effective}; the learning rate is not scaled "
                  f"with it (set --model.optimizer.lr for that)")
        start = time.perf_counter()
        with graceful_ctrl_c(trainer):
            fit(trainer, model, data, run.resumed)
        fit_seconds = time.perf_counter() - start
        speed = next(cb for cb in trainer.callbacks if isinstance(cb, TrainingSpeed))
        best = next((cb.best_model_path for cb in trainer.callbacks
                     if isinstance(cb, ModelCheckpoint) and cb.monitor and cb.best_model_path), None)
        if best is None:
            best = next((cb.last_model_path or cb.best_model_path for cb in trainer.callbacks
                         if isinstance(cb, LastCheckpoint)), None) or None
        metrics = evaluate_with(trainer, "test", model, data, best)
        record = results.run_results("fit", trainer, model, data, run, metrics, fit_seconds, speed, best)
        report(trainer, record, run)
    return record


def evaluate(stage: str, argv: list[str], callbacks: tuple = ()) -> dict:
    """`test`/`validate --ckpt_path CKPT`: evaluate a checkpoint with its own run's configuration."""
    checkpoint, argv = checkpoint_argv(stage, argv)
    with stop_on_sigterm("before testing started"):
        model, data, trainer, run = app.build(stage, argv, checkpoint=checkpoint, callbacks=callbacks)
    with discarded_on_failure(run, trainer):
        if stage == "validate" and not data.has_validation:
            raise DataSetupError(f"{checkpoint.path}'s run has no validation set (--data.val_size 0); "
                                 f"test it instead")
        metrics = evaluate_with(trainer, stage, model, data, str(checkpoint.path))
        record = results.run_results(stage, trainer, model, data, run, metrics, None,
                                     checkpoint=str(checkpoint.path))
        report(trainer, record, run)
    return record


@contextmanager
def discarded_on_failure(run, trainer):
    """A run that fails before it wrote a checkpoint or results leaves nothing behind (runs.discard_if_unused);
    one stopped by a signal keeps its directory, which says where it stopped."""
    try:
        yield
    except Stopped:
        raise
    except BaseException:
        if rank_zero_only.rank == 0:
            speed = next((cb for cb in trainer.callbacks if isinstance(cb, TrainingSpeed)), None)
            runs.discard_if_unused(run, trained=bool(speed and speed.calls))
        raise


def checkpoint_argv(stage: str, argv: list[str]) -> tuple[runs.Checkpoint, list[str]]:
    """The checkpoint a use command names, and its command line: the run's own configuration, the training
    set's normalisation from the checkpoint, then the user's overrides."""
    spec = option_value(argv, "--ckpt_path")
    if not spec:
        if "--help" in argv or "-h" in argv:  # the subcommand's own options need no checkpoint
            app.build(stage, expand_short_names([a for a in argv if a != "-h"] + ["--help"]))  # prints, exits
        raise UsageError(f"{stage} needs --ckpt_path: a checkpoint file, a run directory, or best/last "
                         f"(the newest run's)")
    save_dir = option_value(argv, "--trainer.logger.init_args.save_dir") or "lightning_logs"
    checkpoint = runs.find_checkpoint(spec, Path(save_dir).resolve(), prefer="best")
    rank_zero_only(print)(f"Using {checkpoint.describe()}")
    hp = checkpoint.hparams
    base = ["--config", run_config(checkpoint)]
    if hp.get("mean") is not None:
        base += [f"--data.mean={list(hp['mean'])}", f"--data.std={list(hp['std'])}"]
    rest = expand_short_names(without_option(argv, "--ckpt_path"), default_recipe=False)
    return checkpoint, base + rest + ["--ckpt_path", str(checkpoint.path)]


def run_config(checkpoint: runs.Checkpoint) -> str:
    """The configuration a checkpoint was trained with: its run's newest config file, or (a checkpoint moved out
    of its run) one written from the hyperparameters the checkpoint carries."""
    if checkpoint.run_dir is not None:
        configs = sorted(checkpoint.run_dir.glob("config*.yaml"), key=lambda p: p.stat().st_mtime)
        if configs:
            return str(configs[-1])
    linked = {"image_shape", "num_classes", "class_names", "mean", "std", "accumulate_grad_batches",
              "_instantiator", "seed"}
    model = {k: v for k, v in checkpoint.hparams.items() if k not in linked}
    data = {k: v for k, v in checkpoint.contents.get("datamodule_hyper_parameters", {}).items() if k not in linked}
    if "_class_path" not in data:
        raise runs.CheckpointError(f"{checkpoint.path} does not say which data set it was trained on, and there is "
                                   f"no config.yaml beside its folder; pass --config with that run's config")
    config = {"model": {"class_path": model.pop("_class_path", "lit_models.ImageClassifier"), "init_args": model},
              "data": {"class_path": data.pop("_class_path"), "init_args": data}}
    return yaml.safe_dump(config)


def evaluate_with(trainer, stage: str, model, data, checkpoint: str | None) -> dict:
    """trainer.test or trainer.validate on `checkpoint`'s weights; a signal stops it with a message."""
    run = trainer.test if stage == "test" else trainer.validate
    with stopped_as(trainer, "while testing" if stage == "test" else "while validating",
                    "the checkpoint is unchanged; run the same command again to evaluate it"):
        (metrics,) = run(model, datamodule=data, ckpt_path=checkpoint, verbose=False, weights_only=True)
    return metrics


def report(trainer, record: dict, run) -> None:
    if trainer.is_global_zero:
        results.write(record, run.dir)
        results.print_summary(record)


def fit(trainer, model, data, checkpoint: runs.Checkpoint | None) -> None:
    """trainer.fit; Ctrl-C and SIGTERM become a Stopped that names the checkpoint written."""
    with stopped_as(trainer, "in epoch {epoch} at step {step}", "Add --ckpt_path last to the same command to go on.",
                    saved=True):
        trainer.fit(model, datamodule=data, ckpt_path=str(checkpoint.path) if checkpoint else None,
                    weights_only=True)


@contextmanager
def stopped_as(trainer, where: str, how_to_go_on: str, saved: bool = False):
    """Turn Lightning's exits on Ctrl-C and SIGTERM into a Stopped with a message and exit code 130 / 143."""
    try:
        yield
    except SystemExit as e:  # Lightning exits after Ctrl-C; SIGTERMException is a SystemExit too
        if not trainer.interrupted and not isinstance(e, SIGTERMException):
            raise
        sigterm = isinstance(e, SIGTERMException) and not getattr(trainer, "stopped_by_ctrl_c", False)
        name, code = ("SIGTERM", 143) if sigterm else ("Ctrl-C", 130)
        what = where.format(epoch=trainer.current_epoch, step=trainer.global_step)
        if saved:
            path = next((cb.interrupted_path for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)), None)
            if path is None and not Path(trainer.default_root_dir, "checkpoints", "last.ckpt").is_file():
                raise Stopped(f"stopped by {name} {what}, before the first checkpoint: nothing to resume; run the "
                              f"same command again to start over", code) from None
            what += f"; saved {path}" if path else "; its last epoch will run again"
        raise Stopped(f"stopped by {name} {what}. {how_to_go_on}", code) from None


@contextmanager
def graceful_ctrl_c(trainer):
    """The first Ctrl-C stops training after the current step, as SIGTERM does, so that the checkpoint is exact;
    a second one stops at once."""
    def handler(signum, frame):
        if getattr(trainer, "stopped_by_ctrl_c", False):
            raise KeyboardInterrupt
        trainer.stopped_by_ctrl_c = True
        trainer._signal_connector.received_sigterm = True  # Lightning stops between steps and checkpoints
        print("\nStopping after this step (Ctrl-C again to stop at once) ...", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


@contextmanager
def stop_on_sigterm(when: str):
    """SIGTERM outside Lightning's loops (reading data, building the model) stops with a message, not silently."""
    def handler(signum, frame):
        raise Stopped(f"stopped by SIGTERM {when}; nothing was trained", 143)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def release_process_group() -> None:
    """Destroy the DDP process group before the interpreter exits.

    Lightning leaves it alive, and gloo's worker threads then die during interpreter teardown: one run in
    ten or so aborted with "terminate called without an active exception" (SIGABRT) after it had finished.
    Only called where every rank got to the same point: destroying it mid-collective can hang.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def run(argv: list[str], callbacks: tuple = ()) -> dict:
    """Run one command line in this process and return its results (what sweeps call per trial)."""
    stage, argv = split_stage(argv)
    if ("--help" in argv or "-h" in argv) and stage in ("fit", "test", "validate"):
        rest = [a for a in argv if a not in ("--help", "-h", "all")]
        if "all" in argv:  # LightningCLI's own help: every option, with its type
            app.parse(stage, expand_short_names(rest) + ["--help"])
        elif stage == "fit":
            help.print_help(stage, expand_short_names(rest))
        else:
            help.print_help(stage, checkpoint_argv(stage, rest)[1] if option_value(rest, "--ckpt_path")
                            else expand_short_names(rest))
        return {}
    if stage == "fit":
        return fit_and_test(argv, callbacks)
    if stage in ("test", "validate"):
        return evaluate(stage, argv, callbacks)
    if stage == "predict":
        from cli import predict
        return predict.run(*checkpoint_argv(stage, argv))
    from cli import export
    return export.run(*checkpoint_argv(stage, argv))


def argument_error(error: BaseException) -> str:
    """jsonargparse's error in one line: the full option name and the innermost reason.

    Its own message nests one "Parser key" and union-type dump per level (10 lines for a batch size of 0).
    """
    keys, option, chain = [], None, []
    while error is not None and len(chain) < 50:
        chain.append(error)
        error = error.__cause__ or error.__context__
    for e in chain:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        key = re.match(r'Parser key "([^"]+)"', first)
        if key and (not keys or keys[-1] != key.group(1)):
            keys.append(key.group(1))
        option = option or re.search(r"Option '([^']+)' is not accepted", str(e))
    innermost = str(chain[-1]).strip().splitlines()[0] if str(chain[-1]).strip() else type(chain[-1]).__name__
    typed = next((line.strip() for e in chain for line in str(e).splitlines() if "Not of type" in line), None)
    name = "--" + ".".join(keys) if keys else None
    if option:
        return f"{name + '.' if name else '--'}{option.group(1)} is not an option here (--help lists them)"
    if name is None:
        return innermost
    if typed:
        return f"{name}: {typed.split(': ', 1)[-1]} (not a {typed.split()[3].rstrip(':')})"
    got = re.match(r"Expected a <class '(\w+)'>\. Got value: (.*)", innermost)
    if got:
        return f"{name}: expected a value of type {got.group(1)}, got '{got.group(2)}'"
    path = re.match(r"Expected a dot import path string: (.*)", innermost)
    if path:
        return f"{name}: '{path.group(1)}' is not a class it knows (a full path like torch.optim.SGD works)"
    return f"{name}: {innermost}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    quiet_warnings()
    try:
        run(argv)
        release_process_group()
    except SIGTERMException:  # raised by the image decoding pool, outside Lightning's loops
        print("train.py: stopped by SIGTERM before training began; nothing was trained", file=sys.stderr)
        return 143
    except SystemExit as e:  # jsonargparse after printing a help (--help all, --model.help, --data.help)
        return e.code if isinstance(e.code, int) else 0
    except Stopped as e:
        if e.exit_code == 143:  # Lightning agrees on a SIGTERM stop across ranks; Ctrl-C can land mid-collective
            release_process_group()
        print(f"train.py: {e}", file=sys.stderr)
        return e.exit_code
    except runs.NothingToDo as e:
        print(f"train.py: {e}", file=sys.stderr)
        release_process_group()
        return 0
    except KeyboardInterrupt:
        print("train.py: stopped by Ctrl-C before training began; nothing was trained", file=sys.stderr)
        return 130
    except Exception as e:
        cause = user_error(e)
        if verbose or cause is None:  # anything else is a bug: its traceback is the useful report
            raise
        code, message = cause
        print(f"usage: {USAGE}\ntrain.py: error: {message}" if code == 2 else f"train.py: error: {message}",
              file=sys.stderr)
        return code
    return 0


# Errors in the command line: exit code 2, with the usage line.
USAGE_ERRORS = (UsageError, app.SeedError, app.OptimizerError, NetworkShapeError, MisconfigurationException)


def user_error(error: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for an error a user can fix, also when it arrives wrapped in another (jsonargparse
    wraps what a class raises while it is built); None for anything else, which is a bug to show in full."""
    chain = []
    while error is not None and len(chain) < 50:
        chain.append(error)
        error = error.__cause__ or error.__context__
    for e in reversed(chain):  # the innermost is the one that says what happened
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return 1, (f"the GPU ran out of memory ({first_line(e)}). Try a smaller --data.batch_size, or "
                       f"--data.on_device false to keep the data set in host memory.")
        if isinstance(e, USER_ERRORS):
            return 1, first_line(e)
        if isinstance(e, USAGE_ERRORS):
            return 2, first_line(e)
    if isinstance(chain[0], ArgumentError):
        return 2, argument_error(chain[0])
    return None


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

