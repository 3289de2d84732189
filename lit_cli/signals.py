"""Stopping honestly at any moment of a command: the first Ctrl-C stops as SIGTERM does (a fit
after its step, with a checkpoint to go on from), and every stop ends in one line that says what
was saved, with exit code 143 (SIGTERM) or 130 (Ctrl-C)."""

import signal
import sys
import threading

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_cli.errors import Stopped
from lit_cli.runs import log_dir
from lit_common.process import python_default, starting
from lit_models import LastCheckpoint


class Stops:
    """SIGTERM and Ctrl-C while a command runs, from its command line to its last record.

    Inside a Trainer's stage Lightning's handler notes SIGTERM (it calls this one too) and its
    loops stop after the step; anywhere else (building the command, reading a checkpoint, between
    stages, writing records, exporting) the stop is raised at once as Lightning's
    SIGTERMException, which leaves no temporary file of `written_whole` behind. The first Ctrl-C
    is a SIGTERM; a second one stops at once (Lightning's KeyboardInterrupt). A caller with a
    SIGTERM handler of its own (a sweep's worker) keeps it."""

    def __init__(self):
        self.pressed = 0
        self.previous: dict = {}
        self.handlers = {signal.SIGTERM: self.on_sigterm, signal.SIGINT: self.on_ctrl_c}
        # While a Trainer call starts (hold): the handler it found, and a SIGTERM held for it.
        self.outer = None
        self.noted = False

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python's handlers run in the main thread alone
        for signum, handler in self.handlers.items():
            owned_by_caller = not starting(signal.getsignal(signum))
            if not owned_by_caller or signum == signal.SIGINT:
                self.previous[signum] = python_default(signal.signal(signum, handler), signum)

    def stop(self) -> None:
        if self.outer is not None:  # a Trainer call that raised
            signal.signal(signal.SIGTERM, self.outer)
            self.outer = None
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def hold(self) -> None:
        """Before a Trainer call: until Lightning's SIGTERM handler is in place, a SIGTERM is held,
        not raised. Raised at once, it landed inside whatever the Trainer was doing, such as
        TensorBoard's writer putting its first event on its queue; that queue's next flush then
        waited for the writer's two-minute timer (a sweep's worker stopped two minutes late). A
        held SIGTERM reaches Lightning when its stage starts (HeldStop), or this command's own
        handler when the call ends (release). Fits, their tests, tests and validations hold it;
        a predict raises at once, as before."""
        if threading.current_thread() is not threading.main_thread() or self.outer is not None:
            return
        self.outer = signal.signal(signal.SIGTERM, self.hold_sigterm)

    def release(self) -> None:
        """After a Trainer call: the handler it found again, and a held SIGTERM raised there."""
        if self.outer is None:
            return
        signal.signal(signal.SIGTERM, self.outer)
        self.outer = None
        self.deliver()

    def deliver(self) -> None:
        """A held SIGTERM, sent again to this process: to Lightning's handler inside a stage."""
        if self.noted:
            self.noted = False
            signal.raise_signal(signal.SIGTERM)

    def hold_sigterm(self, signum, frame) -> None:
        # Held where Lightning's handler (which calls this one) is not yet in place. The handler
        # found is told either way: a sweep's worker notes that its sweep stops. (==, not `is`:
        # each access to a method makes a new bound method.)
        if signal.getsignal(signal.SIGTERM) == self.hold_sigterm:
            self.noted = True
        if callable(self.outer):
            self.outer(signum, frame)

    def how(self) -> tuple[str, int]:
        """What stopped a command, and its exit code."""
        if self.pressed:
            return "Ctrl-C", 130
        return "SIGTERM", 143

    def in_a_stage(self) -> bool:
        """Whether a Trainer's stage has SIGTERM: its handler calls the one it found (this)."""
        return signal.getsignal(signal.SIGTERM) is not self.handlers[signal.SIGTERM]

    def on_sigterm(self, signum, frame) -> None:
        if not self.in_a_stage():
            raise SIGTERMException

    def on_ctrl_c(self, signum, frame) -> None:
        self.pressed += 1
        if self.pressed > 1:
            raise KeyboardInterrupt
        if self.in_a_stage():
            print("\nStopping after this step (Ctrl-C again to stop at once) ...",
                  file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGTERM)


class HeldStop(L.Callback):
    """Hands a SIGTERM that came while a Trainer call started (Stops.hold) to Lightning's handler
    as its stage starts: a fit then stops after its step, as on any SIGTERM."""

    def __init__(self, stops: Stops):
        self.stops = stops

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self.stops.deliver()

    on_train_start = on_validation_start = on_test_start = on_sanity_check_start


def as_stop(cli, stops: Stops, error: BaseException) -> Stopped | None:
    """The Stopped that ends a command which `error` (Lightning's SIGTERMException, a SystemExit
    without a code, which would exit 0; a second Ctrl-C) stopped; None for other errors."""
    # Lightning's end of a second Ctrl-C in a Trainer's stage
    second_ctrl_c = isinstance(error, SystemExit) and stops.pressed > 1 and error.code == 1
    if isinstance(error, KeyboardInterrupt):  # a second Ctrl-C where no Trainer runs
        stops.pressed = max(1, stops.pressed)
    elif not (isinstance(error, SIGTERMException) or second_ctrl_c):
        return None
    return stopped(cli, stops)


def stopped(cli, stops: Stops) -> Stopped:
    """The one line of a command stopped by a signal, and its exit code."""
    by, code = stops.how()
    trainer = getattr(cli, "trainer", None)
    if trainer is None:
        return Stopped(f"stopped by {by} before the command started; nothing was written", code)
    if cli.subcommand != "fit":
        doing = f"{cli.subcommand.rstrip('e')}ing {cli.given.ckpt_path}"
        written = wrote(trainer) or "no results were written"
        return Stopped(f"stopped by {by} while {doing}; {written}", code)
    if not cli.fitted:
        return Stopped(f"stopped by {by} in epoch {trainer.current_epoch} at step "
                       f"{trainer.global_step}; {saved(trainer)}", code)
    run = log_dir(trainer) or cli.best or "CHECKPOINT"
    testing = trainer.state.fn == "test"
    when = "after the fit, before its test; its"
    if testing:
        when = "while testing after the fit, whose"
    results = ""
    written = wrote(trainer)
    if written:
        results = f"; {written}"
    return Stopped(f"stopped by {by} {when} checkpoints are whole: train.py test --ckpt_path {run} "
                   f"tests it{results}", code)


def wrote(trainer) -> str | None:
    """The record a command wrote whole before it stopped (Trainer.wrote), if it wrote one."""
    written = getattr(trainer, "wrote", None)
    if written is None:
        return None
    return f"{written} was written whole"


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
