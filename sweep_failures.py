"""Failed trials of a sweep: each said in one line and noted in the study, and the rule by which a
study whose trials keep failing the same way stops, where it would make failed trials for ever.

A failed trial is one whose train.py command ended in an error of its own. A trial stopped by a
signal, or whose process was killed, is not: it is queued to run again (sweep_workers)."""

import sys
import traceback

import optuna
from optuna.trial import FrozenTrial, TrialState

from lit_cli.errors import explain

DONE = (TrialState.COMPLETE, TrialState.PRUNED)
# Before any trial completed, this many failures in a row with one error stop the study: its
# every setting fails. After one completed, as many in a row as the trials asked: a region of the
# space that fails (a learning rate that diverges) is a result, not a reason to stop.
FAILURES_BEFORE_ANY = 3


def error_line(error: BaseException) -> str:
    """What ended a trial, in one line: train.py's own line where it has one."""
    code, message = explain(error)
    if code is None:
        message = f"{type(error).__name__}: {error}"
    return message.strip().split("\n")[0]


def note_failure(trial: optuna.Trial, error: BaseException, setting: str) -> None:
    """The failed trial's error noted in the study and said in one line; with its traceback
    where it is a bug (as train.py shows one)."""
    line = error_line(error)
    trial.set_user_attr("error", line)
    if explain(error)[0] is None:
        traceback.print_exception(error)
    print(f"trial {trial.number} ({setting}): failed: {line}", file=sys.stderr, flush=True)


def ended(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that ended on their own, in order: complete, pruned, or failed with an error
    (not stopped, not killed)."""
    trials = study.get_trials(deepcopy=False)
    return [t for t in trials if t.state in DONE or "error" in t.user_attrs]


def failing_the_same_way(study: optuna.Study, trials: int) -> str | None:
    """The error of the study's last failures where they are enough in a row to stop it
    (FAILURES_BEFORE_ANY), else None."""
    history = ended(study)
    row = FAILURES_BEFORE_ANY
    if any(t.state in DONE for t in history):
        row = max(row, trials)
    errors = [t.user_attrs.get("error") for t in history[-row:]]
    if len(errors) < row or len(set(errors)) > 1:
        return None
    return errors[0]  # None where they completed


def failed(study: optuna.Study) -> list[FrozenTrial]:
    """The study's failed trials, in order (not those stopped or killed)."""
    return [t for t in study.get_trials(deepcopy=False) if "error" in t.user_attrs]
