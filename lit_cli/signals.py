"""Stopping honestly: the first Ctrl-C stops a fit as SIGTERM does, after the step with a checkpoint
to go on from, and every stop ends in one line that says what was saved."""

import signal
import sys

from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_cli.errors import Stopped
from lit_cli.runs import log_dir
from lit_models import LastCheckpoint


class CtrlC:
    """While started, the first Ctrl-C raises SIGTERM, which Lightning handles between two steps
    (LastCheckpoint saves there); a second one stops at once (Lightning's KeyboardInterrupt)."""

    def __init__(self):
        self.pressed = False
        self.previous = None

    def start(self) -> None:
        self.previous = signal.signal(signal.SIGINT, self.handler)

    def stop(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None

    def how(self) -> tuple[str, int]:
        """What stopped a command, and its exit code."""
        if self.pressed:
            return "Ctrl-C", 130
        return "SIGTERM", 143

    def handler(self, signum, frame) -> None:
        self.pressed = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nStopping after this step (Ctrl-C again to stop at once) ...", file=sys.stderr,
              flush=True)
        signal.raise_signal(signal.SIGTERM)


def stopped(cli, ctrl_c: CtrlC) -> Stopped:
    """The one line of a command stopped by Lightning's SIGTERMException, and its exit code."""
    by, code = ctrl_c.how()
    trainer = cli.trainer
    if cli.subcommand != "fit":
        checkpoint = cli.given.ckpt_path
        doing = f"{cli.subcommand.rstrip('e')}ing"
        return Stopped(f"stopped by {by} while {doing} {checkpoint}; no results were written", code)
    if not cli.fitted:
        return Stopped(f"stopped by {by} in epoch {trainer.current_epoch} at step "
                       f"{trainer.global_step}; {saved(trainer)}", code)
    run = log_dir(trainer) or cli.best or "CHECKPOINT"
    testing = trainer.state.fn == "test"
    when = "after the fit, before its test; its"
    if testing:
        when = "while testing after the fit, whose"
    return Stopped(f"stopped by {by} {when} checkpoints are whole: train.py test --ckpt_path {run} "
                   f"tests it", code)


def saved(trainer) -> str:
    """What a fit stopped by a signal saved, and how to go on."""
    last = [c.saved_on_stop for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint)]
    if not last or last[0] is None:
        return "no checkpoint was written"
    return f"saved {last[0]}; add --ckpt_path {last[0]} to the same command to go on"


def raise_if_asked(trainer) -> None:
    """SIGTERMException if a SIGTERM arrived that Lightning noted without stopping: at a stage's
    last batch its loop ends as if nothing happened, and the next stage forgets it."""
    if trainer.received_sigterm:
        raise SIGTERMException
