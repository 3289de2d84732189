"""A sweep's study: trials that fail are told from trials that a signal stopped, a study whose
trials keep failing the same way stops, a sweep with no trial complete exits 1, and sweeps that
open one new study at once all open it. In this process, with a train.py that fails at once
where a trial would train: quick (but for one test of processes, marked slow)."""

import logging
import os
import signal
import subprocess
import sys
import threading
import warnings

import optuna
import pytest
from conftest import ROOT, run_sweep
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

import sweep
import sweep_failures
import sweep_workers
from lit_cli.errors import UsageError
from lit_models import ModelError

BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "1"]
SPACE = {"model.lr": {"low": 0.01, "high": 0.1, "log": True}}
DIVERGED = "the weights became NaN or infinite in epoch 0 (by step 9)"


@pytest.fixture
def in_a_worker(tmp_path):
    """What a worker process sets, set back after the test: its SIGTERM handler and the levels
    of Optuna's and Lightning's logs."""
    handler = signal.getsignal(signal.SIGTERM)
    verbosity = optuna.logging.get_verbosity()
    level = logging.getLogger("lightning.pytorch").level
    yield tmp_path
    signal.signal(signal.SIGTERM, handler)
    optuna.logging.set_verbosity(verbosity)
    logging.getLogger("lightning.pytorch").setLevel(level)


def objective(folder, space=SPACE) -> sweep_workers.Objective:
    turn = sweep_workers.FileTurn(folder / ".turn.lock")
    return sweep_workers.Objective(BASE, space, False, [0], folder, "", turn)


def train_py(monkeypatch, *ends) -> list:
    """train.py's command in a trial, replaced: the nth call ends as the nth of `ends` does (the
    last one for the rest), an exception raised or a function called. The calls' arguments."""
    calls = []

    def command(args, callbacks=()):
        calls.append(args)
        end = ends[min(len(calls), len(ends)) - 1]
        if isinstance(end, BaseException):
            raise end
        end()

    monkeypatch.setattr(sweep_workers.train, "TrainCLI", command)
    return calls


def test_a_study_whose_trials_fail_the_same_way_stops_after_three_and_says_why(in_a_worker,
                                                                                monkeypatch,
                                                                                capfd):
    """Each failed trial was a new one, for ever, each with Optuna's traceback."""
    folder = in_a_worker
    store = sweep.storage(f"sqlite:///{folder / 'study.db'}")
    study = sweep_workers.open_study("s", store, SPACE, False, 0)
    work = objective(folder)

    def stop():  # the old code's end, to fail and not spin
        work.stop_asked = True
        raise KeyboardInterrupt

    calls = train_py(monkeypatch, *[ModelError(DIVERGED)] * 10, stop)
    sweep_workers.work("s", store, work, 20, 1, 0)
    assert len(calls) == 3
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 3
    assert all(t.user_attrs["error"] == DIVERGED for t in trials)
    assert sweep.finish(study, work, 20, []) == 1
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert lines[-1] == ("sweep.py: error: the trials keep failing the same way, so the sweep "
                         f"stopped: {DIVERGED}")
    lr = trials[2].params["model.lr"]
    assert f"trial 2 (model.lr={lr}): failed: {DIVERGED}" in lines and "Traceback" not in err


LR = {"model.lr": FloatDistribution(0.0, 10.0)}


def failed(error: str, lr: float) -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.FAIL, params={"model.lr": lr}, user_attrs={"error": error},
                        distributions=LR)


def done(lr: float) -> optuna.trial.FrozenTrial:
    return create_trial(value=0.9, params={"model.lr": lr},
                        distributions=LR)


def stopped(lr: float) -> optuna.trial.FrozenTrial:
    """A trial stopped by a signal, or killed: failed, with no error of its own."""
    return create_trial(state=TrialState.FAIL, params={"model.lr": lr},
                        distributions=LR)


@pytest.mark.parametrize("trials, stops", [
    ([failed("a", 1), failed("a", 2)], None),
    ([failed("a", 1), failed("a", 2), failed("a", 3)], "a"),
    ([failed("a", 1), stopped(2), failed("a", 3), stopped(4), failed("a", 5)], "a"),
    ([failed("a", 1), failed("b", 2), failed("a", 3)], None),
    ([failed("a", 1), done(2), failed("a", 3), failed("a", 4)], None),
    # once a trial completed: as many failures in a row as the trials asked (5)
    ([done(1), *[failed("a", i) for i in range(2, 6)]], None),
    ([done(1), *[failed("a", i) for i in range(2, 7)]], "a"),
    ([done(1), *[failed("a", i) for i in range(2, 6)], failed("b", 6)], None),
])
def test_a_study_stops_on_one_error_in_a_row_three_times_or_as_many_as_asked_after_a_result(
        trials, stops):
    """A region of the space that fails (a learning rate that diverges) is a result: a study that
    has one complete trial goes on past three failures."""
    study = optuna.create_study()
    study.add_trials(trials)
    assert sweep_failures.failing_the_same_way(study, 5) == stops


def test_a_trial_whose_train_py_exits_without_a_stop_fails_and_is_not_queued_again(in_a_worker,
                                                                                     monkeypatch,
                                                                                     capfd):
    """jsonargparse's exit (2) on a sampled value was taken for Lightning's end of a stop: the
    trial was queued again, and the sweep said 'stopped' with nothing stopped."""
    folder = in_a_worker
    study = optuna.create_study(direction="maximize")
    train_py(monkeypatch, SystemExit(2))
    try:
        study.optimize(objective(folder), n_trials=1, catch=(Exception,))
    except KeyboardInterrupt:  # (not to end pytest)
        pass
    (trial,) = study.get_trials()
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["error"] == "train.py exited with code 2 (its message is above)"
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("end", [SystemExit(1), KeyboardInterrupt(), ModelError("broken")])
def test_a_trial_ended_while_its_sweep_stops_is_queued_again_whatever_ended_it(end, in_a_worker,
                                                                               monkeypatch):
    """A stop reaches train.py as Lightning's exit (1), a KeyboardInterrupt, or an error of what
    it broke: each trial runs again when the sweep goes on, and none counts as a failure."""
    folder = in_a_worker
    study = optuna.create_study(direction="maximize")
    work = objective(folder)

    def signalled():
        work.stop_asked = True  # the worker's SIGTERM handler
        raise end

    train_py(monkeypatch, signalled)
    with pytest.raises(KeyboardInterrupt):  # optimize() ends on it
        study.optimize(work, n_trials=1, catch=(Exception,))
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]
    assert not sweep_failures.failed(study)


def a_study_of(folder, trials: list) -> None:
    """The study `g` of the sweeps below, with `trials` in it."""
    store = sweep.storage(sweep.study_url(folder / "lightning_logs" / "sweeps" / "g"))
    optuna.create_study(study_name="g", storage=store, direction="maximize").add_trials(trials)


@pytest.mark.parametrize("trials, line", [
    ([failed(DIVERGED, 0.01), failed("b", 0.02)],
     "sweep.py: error: no trial completed (2 failed; the last with: b)"),
    ([failed(DIVERGED, 0.01), failed(DIVERGED, 0.02), failed(DIVERGED, 0.03)],
     f"sweep.py: error: the trials keep failing the same way, so the sweep stopped: {DIVERGED}"),
])
def test_a_sweep_with_no_trial_complete_exits_1_and_says_why(trials, line, mnist_dir, tmp_path,
                                                             monkeypatch, capsys):
    """Every setting of the grid failed: the same command again runs nothing. It exited 0, with
    FAIL in every row of its table."""
    (tmp_path / "lightning_logs" / "sweeps" / "g").mkdir(parents=True)
    a_study_of(tmp_path, trials)
    lrs = ",".join(str(t.params["model.lr"]) for t in trials)
    monkeypatch.chdir(tmp_path)
    code = run_sweep(["--grid", f"model.lr={lrs}", "--name", "g", *BASE,
                      "--data.data_dir", str(mnist_dir)])
    out, err = capsys.readouterr()
    assert "Sweep g: nothing left to run" in out and "FAIL" in out
    assert code == 1 and err.strip().splitlines()[-1] == line, err[-2000:]


def test_sweeps_opening_one_new_sqlite_study_at_once_all_open_it(tmp_path):
    """Eight at once, four times: SQLAlchemy makes each of Optuna's tables where it found none a
    moment before, and most rounds ended in 'table study_directions already exists' (or
    studies, trials, version_info, alembic_version) for some."""
    errors = []
    for round_ in range(4):
        folder = tmp_path / str(round_)
        folder.mkdir()
        url = sweep.study_url(folder)
        start = threading.Barrier(8)

        def open_it():
            start.wait()
            try:
                sweep_workers.open_study("s", sweep.storage(url), {}, False, 0)
            except UsageError as e:
                errors.append(str(e))

        threads = [threading.Thread(target=open_it) for _ in range(8)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert optuna.get_all_study_names(url) == ["s"]
    assert errors == []


# Each process, once imported, opens one new study in each of 10 folders, in each as soon as all
# have come to it (started together, they reached the first seconds apart). It goes on past a
# failure, which it prints on stdout, as the others wait for it in the next folder.
OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
import sweep, sweep_workers
root, name, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for round_ in range(4):
    folder = root / str(round_)
    (folder / "ready").mkdir(parents=True, exist_ok=True)
    (folder / "ready" / name).touch()
    while len(list((folder / "ready").iterdir())) < count:
        time.sleep(0.001)
    try:
        sweep_workers.open_study("s", sweep.storage(sweep.study_url(folder)), {}, False, 0)
    except Exception as e:
        print(e)
"""


@pytest.mark.slow
def test_processes_opening_one_new_sqlite_study_at_once_all_open_it(tmp_path):
    """Some failed: 'table study_directions already exists' (or studies, trials, ...)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(tmp_path), str(i), "3"],
                              env=env, stdout=subprocess.PIPE, text=True) for i in range(3)]
    try:
        errors = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0] * 3 and not "".join(errors), errors
    for round_ in range(4):
        assert optuna.get_all_study_names(sweep.study_url(tmp_path / str(round_))) == ["s"]
