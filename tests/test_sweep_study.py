"""A sweep's study, with a train.py whose runs end as each test says, in this process: failed
trials told from stopped ones, a sweep whose trials all fail ends after the trials asked and exits
1, a stopped trial runs again once, each waiting trial of an SQLite study goes to one worker.
Quick: nothing trains."""

import os
import signal
import threading
from types import SimpleNamespace

import optuna
import pytest
import yaml
from conftest import run_sweep
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from sqlalchemy.engine import make_url

import sweep
from lit_cli.errors import Stopped
from lit_models import ModelError
from lit_sweep import study

BASE = ["--model", "mlp", "--data.batch_size", "64"]
SPACE = "model.optimizer.lr: {low: 0.01, high: 0.1, log: true}\n"
DIVERGED = "the weights became NaN or infinite in epoch 0 (by step 9)"


def train_py(*ends) -> tuple[type, list]:
    """train.py's TrainCLI, replaced: the nth run ends as the nth of `ends` does (the last one for
    the rest): an exception raised, a function called with the run's folder, or a value logged
    as val/acc_best. Its runs' command lines."""
    calls = []

    class TrainCLI:
        def __init__(self, args, callbacks=None, run=True):
            self.datamodule = None  # what run=False builds, and the seed it parsed
            seeds = [args[i + 1] for i, arg in enumerate(args) if arg == "--seed_everything"]
            self.config = SimpleNamespace(seed_everything=int((seeds or [0])[-1]))
            if not run:
                return
            calls.append(args)
            end = ends[min(len(calls), len(ends)) - 1]
            if isinstance(end, BaseException):
                raise end
            folder = args[-3].split("=", 1)[1]  # --trainer.default_root_dir=...
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "config.yaml"), "w") as f:
                yaml.safe_dump({"trainer": {"default_root_dir": folder}, "seed": args[-4]}, f)
            value = end(folder) if callable(end) else end
            self.record = {"metrics": {"val/acc_best": value, "test/acc": 0.5},
                           "log_dir": folder}

    return TrainCLI, calls


def run(args: list[str], cli, capfd) -> tuple[int, list[str], list[str]]:
    """sweep.py ARGS with train.py's TrainCLI `cli`: its exit code, and its stdout and stderr
    lines."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep.train, "TrainCLI", cli)
        code = run_sweep([*args, *BASE])
    out, err = capfd.readouterr()
    return code, out.strip().splitlines(), err.strip().splitlines()


def trials(name: str = "s") -> list[optuna.trial.FrozenTrial]:
    url = study.storage(f"sqlite:///lightning_logs/sweeps/{name}/study.db", 20)
    return optuna.load_study(study_name=name, storage=url).get_trials()


@pytest.fixture
def here(tmp_path, monkeypatch):
    """In tmp_path, with a space there; Optuna's log level as it was after the test."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE)
    verbosity = optuna.logging.get_verbosity()
    yield tmp_path
    optuna.logging.set_verbosity(verbosity)


def test_a_grid_runs_each_setting_once_with_each_seed_and_the_same_command_again_nothing(here,
                                                                                        capfd):
    cli, calls = train_py(lambda folder: 0.8 + 0.01 * len(folder.split("seed_")[1]))
    args = ["--grid", "model.optimizer.lr=0.01,0.02", "--seeds", "2", "--seed_everything", "5",
            "--name", "s"]
    code, out, err = run(args, cli, capfd)
    assert code == 0, err
    folder = here / "lightning_logs" / "sweeps" / "s"
    assert [c[-5:-1] for c in calls[:2]] == [
        ["--model.optimizer.lr=0.01", "--seed_everything=5",
         f"--trainer.default_root_dir={folder}/trial_0000/seed_5",
         "--trainer.enable_progress_bar=false"],
        ["--model.optimizer.lr=0.01", "--seed_everything=6",
         f"--trainer.default_root_dir={folder}/trial_0000/seed_6",
         "--trainer.enable_progress_bar=false"]]
    assert len(calls) == 4 and calls[3][-5:-3] == ["--model.optimizer.lr=0.02",
                                                   "--seed_everything=6"]
    # the mean of the seeds' values (0.8 + 0.01 * len("5") and len("6"))
    assert [(t.params, t.value) for t in trials()] == [({"model.optimizer.lr": 0.01}, 0.81),
                                                       ({"model.optimizer.lr": 0.02}, 0.81)]
    assert out[-1] == ("Best: trial 0, val/acc_best 0.8100 (model.optimizer.lr=0.01); "
                       f"python train.py --config {folder}/best.yaml")
    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best == {"trainer": {"default_root_dir": None}, "seed": "--seed_everything=5"}
    summary = (folder / "summary.csv").read_text().splitlines()
    assert summary[0] == "number,value,state,params_model.optimizer.lr" and len(summary) == 3
    again, out, _ = run(args, cli, capfd)
    assert again == 0 and len(calls) == 4 and len(trials()) == 2
    assert out[0] == f"Sweep s: 0 trials to run; study in sqlite:///{folder}/study.db"
    assert out[-1].startswith("Best: trial 0, val/acc_best 0.8100")


def test_an_objective_to_minimize_ranks_the_least_best(here, capfd):
    cli, _ = train_py(lambda folder: {"0": 0.3, "1": 0.2, "2": 0.4}[folder[-1]])
    args = ["--grid", "model.optimizer.lr=0.01,0.02,0.03", "--objective", "val/acc_best",
            "--direction", "minimize", "--name", "s"]
    code, out, _ = run(args, cli, capfd)
    assert code == 0 and out[-1].startswith("Best: trial 1, val/acc_best 0.2000 "
                                            "(model.optimizer.lr=0.02)")


def test_a_space_samples_its_trials_and_goes_on_with_new_settings(here, capfd):
    cli, calls = train_py(0.9)
    code, _, err = run(["--space", "space.yaml", "--trials", "3", "--name", "s"], cli, capfd)
    assert code == 0 and len(calls) == 3, err
    assert run(["--space", "space.yaml", "--trials", "5", "--name", "s"], cli, capfd)[0] == 0
    lrs = [t.params["model.optimizer.lr"] for t in trials()]
    assert len(lrs) == len(set(lrs)) == 5 and all(0.01 <= lr <= 0.1 for lr in lrs)


def test_a_sweep_whose_every_trial_fails_runs_the_trials_asked_and_says_why(here, capfd):
    """Each failed trial was a new one, for ever, each with Optuna's traceback."""
    cli, calls = train_py(ModelError(DIVERGED))
    code, _, err = run(["--space", "space.yaml", "--trials", "3", "--name", "s"], cli, capfd)
    assert code == 1 and len(calls) == 3
    assert [t.state for t in trials()] == [TrialState.FAIL] * 3
    assert all(t.user_attrs["error"] == DIVERGED for t in trials())
    assert err[-1] == f"sweep.py: error: no trial completed (3 failed: {DIVERGED})"
    lr = trials()[2].params["model.optimizer.lr"]
    assert f"trial 2 (model.optimizer.lr={lr}): failed: {DIVERGED}" in err
    assert "Traceback" not in "\n".join(err)
    # a failure counts among the trials asked: the same command again runs none
    assert run(["--space", "space.yaml", "--trials", "3", "--name", "s"], cli, capfd)[0] == 1
    assert len(calls) == 3


def test_a_trial_whose_train_py_exits_without_a_stop_fails_and_is_not_queued_again(here, capfd):
    """jsonargparse's exit (2) on a sampled value was taken for Lightning's end of a stop: the
    trial was queued again, and the sweep said 'stopped' with nothing stopped."""
    cli, _ = train_py(SystemExit(2))
    code, _, err = run(["--name", "s"], cli, capfd)
    assert [t.state for t in trials()] == [TrialState.FAIL]
    assert code == 1 and err[-2:] == ["trial 0 (as given): failed: SystemExit: 2",
                                      "sweep.py: error: no trial completed (1 failed: "
                                      "SystemExit: 2)"]


def signalled(end: BaseException):
    """A run that a SIGTERM reaches, which then ends as `end`."""
    def run_(folder):
        os.kill(os.getpid(), signal.SIGTERM)  # the worker's handler notes it
        raise end
    return run_


@pytest.mark.parametrize("ends, code", [
    ([0.9, Stopped("stopped by Ctrl-C in epoch 0 at step 3; saved last.ckpt", 130)], 130),
    ([0.9, signalled(ModelError("broken by the stop"))], 143),
    ([lambda folder: os.kill(os.getpid(), signal.SIGINT) or 0.7], 130),  # before its next run
])
def test_a_trial_ended_while_its_sweep_stops_runs_again_once_when_it_goes_on(ends, code, here,
                                                                              capfd):
    """A stop ends train.py's command in Stopped (LastCheckpoint), or in an error of what it broke,
    or comes between runs: the trial runs again when the same command goes on, none counts as
    failed, none runs twice."""
    cli, calls = train_py(*ends, 0.8)
    args = ["--grid", "model.optimizer.lr=0.01,0.02,0.03", "--seeds", "2", "--name", "s"]
    stop, out, err = run(args, cli, capfd)
    how = {130: "Ctrl-C", 143: "SIGTERM"}[code]
    assert stop == code and err[-1] == (f"sweep.py: stopped by {how} with 0 trials complete or "
                                        f"pruned; the same command goes on with the study")
    assert [t.state for t in trials()] == [TrialState.FAIL, TrialState.WAITING,
                                           TrialState.WAITING, TrialState.WAITING]
    assert not any("error" in t.user_attrs for t in trials()) and "Traceback" not in err
    assert len(calls) == len(ends) and run(args, cli, capfd)[0] == 0
    assert len(calls) == len(ends) + 6
    done = {t.params["model.optimizer.lr"]: t for t in trials() if t.state.name == "COMPLETE"}
    assert sorted(done) == [0.01, 0.02, 0.03] and len(trials()) == 4
    assert done[0.01].system_attrs["failed_trial"] == 0  # the retry of the stopped trial


def test_a_signal_while_a_worker_writes_to_the_study_is_taken_after_the_write(here, capfd,
                                                                              monkeypatch):
    """Raised inside a write of the trial's results, it left an SQLite statement holding its
    lock, and the other workers waited for it."""
    set_user_attr = optuna.Trial.set_user_attr

    def interrupted(trial, key, value):
        if key == "config":
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, before the write
        set_user_attr(trial, key, value)

    monkeypatch.setattr(optuna.Trial, "set_user_attr", interrupted)
    cli, calls = train_py(0.9)
    code, _, err = run(["--grid", "model.optimizer.lr=0.01,0.02", "--name", "s"], cli, capfd)
    assert code == 143 and len(calls) == 1 and "1 trials complete" in err[-1]
    # the next trial was taken, and stopped before its first run: it runs again
    assert [t.state.name for t in trials()] == ["COMPLETE", "FAIL", "WAITING"]
    assert "config" in trials()[0].user_attrs


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # (study.ask here, not optimize)
def test_each_waiting_trial_of_an_sqlite_study_goes_to_one_worker(tmp_path):
    """Eight workers (threads, each with its own connection) take the four waiting trials at
    once: with Optuna's RDBStorage on SQLite, two took one trial (optuna/optuna#4002)."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    made = optuna.create_study(study_name="s", storage=study.storage(url, 20))
    for x in range(4):
        made.enqueue_trial({"x": x})
    studies = [optuna.load_study(study_name="s", storage=study.storage(url, 20)) for _ in range(8)]
    start, taken = threading.Barrier(8), []

    def take(one):
        start.wait()
        taken.append(one.ask().number)

    workers = [threading.Thread(target=take, args=(one,)) for one in studies]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(taken) == list(range(8))  # the four waiting ones, and four new ones


LR = {"model.optimizer.lr": FloatDistribution(0.0, 10.0)}


def failed(error: str, lr: float) -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.FAIL, params={"model.optimizer.lr": lr},
                        user_attrs={"error": error}, distributions=LR)


def done(lr: float) -> optuna.trial.FrozenTrial:
    return create_trial(value=0.9, params={"model.optimizer.lr": lr}, distributions=LR,
                        user_attrs={"config": {"trainer": {"default_root_dir": "elsewhere"}}})


def stopped(lr: float) -> optuna.trial.FrozenTrial:
    """A trial stopped by a signal, or killed: failed, with no error of its own."""
    return create_trial(state=TrialState.FAIL, params={"model.optimizer.lr": lr},
                        distributions=LR)


def a_study_of(folder, trials: list) -> None:
    """The study `g` of the sweeps below, with `trials` in it."""
    (folder / "lightning_logs/sweeps/g").mkdir(parents=True)
    url = f"sqlite:///{folder}/lightning_logs/sweeps/g/study.db"
    optuna.create_study(study_name="g", storage=study.storage(url, 20),
                        direction="maximize").add_trials(trials)


@pytest.mark.parametrize("trials, line", [
    ([failed(DIVERGED, 0.01), failed("b", 0.02)],
     "sweep.py: error: no trial completed (2 failed: b)"),
    ([stopped(0.01), stopped(0.02)], "sweep.py: error: no trial completed (0 failed)"),
])
def test_a_sweep_with_no_trial_complete_exits_1_and_says_why(trials, line, here, capfd):
    """Every setting of the grid failed: the same command again runs nothing. It exited 0, with
    FAIL in every row of its table."""
    a_study_of(here, trials)
    lrs = ",".join(str(t.params["model.optimizer.lr"]) for t in trials)
    cli, calls = train_py(0.9)
    code, out, err = run(["--grid", f"model.optimizer.lr={lrs}", "--name", "g"], cli, capfd)
    assert "Sweep g: 0 trials to run" in out[0] and "FAIL" in out[-1] and not calls
    assert code == 1 and err[-1] == line


@pytest.mark.parametrize("codes, line, code", [
    ([0, -9], "sweep.py: stopped with 1 trials complete or pruned; the same command goes on "
              "with the study", 1),
    ([143, 143, 0], "sweep.py: stopped by SIGTERM with 1 trials complete or pruned; the same "
                    "command goes on with the study", 143),
])
def test_a_sweep_whose_worker_was_killed_or_stopped_says_so_in_one_line(codes, line, code, here,
                                                                       capfd):
    a_study_of(here, [done(0.01), stopped(0.02)])
    url = f"sqlite:///{here}/lightning_logs/sweeps/g/study.db"
    opts = SimpleNamespace(name="g", folder=here / "lightning_logs/sweeps/g",
                           objective="val/acc_best")
    made = optuna.load_study(study_name="g", storage=study.storage(url, 20))
    assert study.finish(made, opts, codes) == code
    out, err = capfd.readouterr()
    assert err.strip() == line and "Best: trial 0, val/acc_best 0.9000" in out


@pytest.mark.parametrize("name", ["a b", "x.y", "-lead", "ünï", "c#1", "50%", "k:v", "q?x"])
def test_a_sweeps_study_is_in_its_own_folder_whatever_its_name(name, tmp_path):
    """A name is a folder's, and part of the default storage's URL: '#', '%' and '?' are not the
    URL's fragment, escape or query there."""
    folder = tmp_path / "sweeps" / name
    assert make_url(study.study_url(folder)).database == str(folder / "study.db")
