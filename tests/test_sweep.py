"""sweep.py with train.py's runs: an Optuna study read back with Optuna's own API; stops by real
signals, to real processes; what the sweep refuses before any trial."""

import glob
import os
import signal
import textwrap
import time
from pathlib import Path

import lightning as L
import optuna
import pytest
from conftest import results, run_sweep, run_train, runs, write_mnist

BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "2"]


def sweep(args: list[str], cwd: Path, data: Path, capfd) -> tuple[int, str, str]:
    """`python sweep.py ARGS` in `cwd`, in this process (its workers, where it has more than one,
    are processes): its exit code, stdout and stderr."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        code = run_sweep([*BASE, *args, "--data.data_dir", str(data)])
    return code, *capfd.readouterr()


def study(cwd: Path, name: str) -> optuna.Study:
    db = cwd / "lightning_logs" / "sweeps" / name / "study.db"
    return optuna.load_study(study_name=name, storage=f"sqlite:///{db}")


def states(cwd: Path, name: str) -> list[str]:
    return sorted(t.state.name for t in study(cwd, name).get_trials())


def each_setting_complete_once(cwd: Path, name: str, lrs: list[float]) -> list:
    """The trials, once every setting of the grid completed once, none left running or waiting,
    and each retry the same setting as the trial it runs again."""
    trials = study(cwd, name).get_trials()
    complete = [t.params["model.optimizer.lr"] for t in trials if t.state.name == "COMPLETE"]
    assert sorted(complete) == sorted(lrs)
    assert {t.state.name for t in trials} <= {"COMPLETE", "FAIL"}
    for t in trials:
        if "failed_trial" in t.system_attrs:
            assert t.params == trials[t.system_attrs["failed_trial"]].params
    return trials


# --- in this process: one worker, the sweep's own -------------------------------------------------

@pytest.mark.slow  # trains
def test_a_space_samples_prunes_and_keeps_count(mnist_dir, tmp_path, capfd):
    # 1e-3 and 1e-1: numbers, as train.py reads YAML (PyYAML's safe_load reads strings)
    (tmp_path / "space.yaml").write_text("model.optimizer.lr: {low: 1e-3, high: 1e-1, log: true}\n"
                                         "data.batch_size: [32, 64]\n")
    args = ["--space", "space.yaml", "--trials", "2", "--name", "s"]
    code, out, err = sweep(args, tmp_path, mnist_dir, capfd)
    assert code == 0, err[-3000:]
    trials = study(tmp_path, "s").get_trials()
    assert len(trials) == 2 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    assert all(0.001 <= t.params["model.optimizer.lr"] <= 0.1 for t in trials)
    assert all(t.params["data.batch_size"] in (32, 64) for t in trials)
    assert all(len(t.intermediate_values) >= 1 for t in trials)  # each epoch's val/acc_best
    assert f"Best: trial {study(tmp_path, 's').best_trial.number}, val/acc_best " in out


@pytest.mark.slow  # trains
def test_a_failing_trial_fails_alone_in_one_line(mnist_dir, tmp_path, capfd):
    args = ["--grid", "model.optimizer.lr=1e12,0.01", "--name", "nan"]
    code, out, err = sweep(args, tmp_path, mnist_dir, capfd)
    assert code == 0, err[-3000:]
    trials = study(tmp_path, "nan").get_trials()
    assert {t.params["model.optimizer.lr"]: t.state.name for t in trials} == {1e12: "FAIL",
                                                                               0.01: "COMPLETE"}
    error = trials[0].user_attrs["error"]
    assert error.startswith("the weights became NaN or infinite in epoch 0")
    assert f"trial 0 (model.optimizer.lr=1000000000000.0): failed: {error}" in err.splitlines()
    assert "Traceback" not in err and "Best: trial 1, val/acc_best" in out


NO_TEST_DATA = ("sweep.py: error: a sweep ranks by validation, never test data: add "
                "--data.val_size 5000")


@pytest.mark.parametrize("args", [
    ["--data.val_size", "0"],
    ["--model", "whitened"],  # every training image trains: it tests its last weights
    ["--data.val_size", "0", "--objective", "val/loss", "--direction", "minimize"],
])
def test_runs_without_a_validation_split_are_refused_before_any_trial(args, mnist_dir, tmp_path,
                                                                      capfd):
    """They were ranked by test/acc: hyperparameters chosen on the test set (issue 56, defect 3)."""
    code, out, err = sweep(["--grid", "model.optimizer.lr=0.01,0.02", *args], tmp_path, mnist_dir,
                           capfd)
    assert code == 2 and err.strip().splitlines()[-1] == NO_TEST_DATA
    assert not (tmp_path / "lightning_logs").exists()


def test_an_objective_of_test_data_is_refused_before_any_trial(mnist_dir, tmp_path, capfd):
    code, _, err = sweep(["--objective", "test/acc"], tmp_path, mnist_dir, capfd)
    assert code == 2 and err.strip().splitlines()[-1] == NO_TEST_DATA


OWN_MODULE = '''
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class Digits(L.LightningModule):
    """A LightningModule as Lightning's docs write one: it logs val_acc and test_acc."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))

    def forward(self, x):
        return self.net(x.float() / 255)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
'''


@pytest.mark.slow  # trains
def test_a_module_that_never_logs_the_objective_ends_the_sweep_in_one_line(mnist_dir, own_modules,
                                                                           capfd):
    """Its `None` was formatted, in two tracebacks (issue 56, defect 7); then --objective val_acc,
    its own metric, ranks its settings."""
    (own_modules / "own.py").write_text(textwrap.dedent(OWN_MODULE))
    args = ["--grid", "model.lr=0.05,0.1", "--model", "own.Digits", "--data", "MNISTDataModule",
            "--trainer.max_epochs", "1"]
    code, _, err = sweep([*args, "--name", "v"], own_modules, mnist_dir, capfd)
    said = [line for line in err.splitlines() if line.startswith("sweep.py")]
    assert code == 2 and "Traceback" not in err and said == [
        "sweep.py: error: the runs log no val/acc_best (in validation: val_acc): name one with "
        "--objective"], err[-3000:]
    assert states(own_modules, "v") == ["FAIL", "WAITING"]  # stopped at the first
    code, out, err = sweep([*args, "--objective", "val_acc"], own_modules, mnist_dir, capfd)
    assert code == 0 and "Best: trial " in out and ", val_acc " in out, err[-3000:]


class Hold(L.Callback):
    """A sweep's moment, for its tests (test_postgres.py's too): at step `step` of the first run
    to reach it (no file `flag` yet) in the process `pid` (0: any), waits for a file of another
    run (the glob `until`, at most 60 s), then sends this process `signals` (comma-separated)."""

    def __init__(self, flag: str, step: int = 1, pid: int = 0, until: str = "",
                 signals: str = ""):
        self.flag, self.step, self.pid, self.until, self.signals = flag, step, pid, until, signals

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step != self.step or self.pid not in (0, os.getpid()):
            return
        if os.path.exists(self.flag):
            return
        open(self.flag, "w").close()
        deadline = time.time() + 60
        while self.until and not glob.glob(self.until, recursive=True):
            assert time.time() < deadline, f"no {self.until}"
            time.sleep(0.05)
        for name in filter(None, self.signals.split(",")):
            os.kill(os.getpid(), getattr(signal, name))


@pytest.mark.slow  # trains
def test_ctrl_c_stops_a_trial_at_a_step_and_the_same_command_runs_it_again_once(mnist_dir,
                                                                                tmp_path, capfd):
    # a Ctrl-C at step 3, and the SIGTERM a sweep passes on to its workers
    args = ["--grid", "model.optimizer.lr=0.005,0.02", "--seeds", "2", "--name", "c",
            "--trainer.callbacks+=test_sweep.Hold", f"--trainer.callbacks.flag={tmp_path / 'f'}",
            "--trainer.callbacks.step=3", "--trainer.callbacks.signals=SIGINT,SIGTERM"]
    code, _, err = sweep(args, tmp_path, mnist_dir, capfd)
    assert code == 130 and err.strip().splitlines()[-1] == (
        "sweep.py: stopped by Ctrl-C with 0 trials complete or pruned; the same command goes on "
        "with the study") and "Traceback" not in err
    assert states(tmp_path, "c") == ["FAIL", "WAITING", "WAITING"]
    folder = tmp_path / "lightning_logs" / "sweeps" / "c"
    (stopped,) = runs(folder / "trial_0000" / "seed_0")
    record = results(stopped)
    assert record["status"] == "stopped by Ctrl-C" and record["global_step"] == 3
    assert (stopped / "checkpoints" / "last.ckpt").is_file()
    # Another command on the study: its trials would be ranked together, refused before any.
    code, _, err = sweep([*args, "--trainer.max_epochs", "3"], tmp_path, mnist_dir, capfd)
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        "sweep.py: error: the study c was made by another command (its train.py options, space, "
        "seeds and objective: [[") and err.strip().endswith("choose another --name")
    assert states(tmp_path, "c") == ["FAIL", "WAITING", "WAITING"]
    code, _, err = sweep(args, tmp_path, mnist_dir, capfd)
    assert code == 0, err[-3000:]
    trials = each_setting_complete_once(tmp_path, "c", [0.005, 0.02])
    for t in [t for t in trials if t.state.name == "COMPLETE"]:  # the mean of its seeds' runs
        seeds = [runs(folder / f"trial_{t.number:04d}" / f"seed_{seed}") for seed in (0, 1)]
        bests = [results(run)["metrics"]["val/acc_best"] for (run,) in seeds]
        assert t.value == pytest.approx(sum(bests) / 2)


def test_lightning_calls_the_sigterm_handler_it_finds(tmp_path):
    """The contract that a worker's SIGTERM handler leans on: a Trainer's run calls it too (a stop
    noted where it lands), and stops after the step."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Term(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    heard = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        trainer = L.Trainer(max_steps=10, callbacks=[Term()], default_root_dir=tmp_path,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        with pytest.raises(SystemExit):  # Lightning's SIGTERMException, after the step
            trainer.fit(BoringModel())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert heard == [signal.SIGTERM] and trainer.global_step == 2


# --- worker processes, stopped: a grid of two settings -------------------------------------------

LRS = [0.005, 0.02]


@pytest.mark.slow  # trains, in two processes
def test_a_sigterm_to_the_sweep_alone_stops_every_worker_and_each_trial_runs_again_once(
        tmp_path, monkeypatch, capfd):
    """The grid's sweep in this process, with a worker process beside it: once the other worker's
    trial has trained an epoch, the sweep's own (Hold) sends this process a SIGTERM, as to the
    sweep alone, which passes it on. Then the same command again, and once more. (One test: a
    fixture of a module's would run on each pytest-xdist worker.)"""
    data = write_mnist(tmp_path / "data")
    folder = tmp_path / "lightning_logs" / "sweeps" / "g"
    command = ["--grid", f"model.optimizer.lr={','.join(map(str, LRS))}", "--parallel", "2",
               "--name", "g", *BASE, "--trainer.max_epochs", "10", "--data.data_dir", str(data),
               "--trainer.callbacks+=test_sweep.Hold", f"--trainer.callbacks.flag={tmp_path / 'f'}",
               f"--trainer.callbacks.pid={os.getpid()}",
               f"--trainer.callbacks.until={folder}/trial_*/**/last.ckpt",
               "--trainer.callbacks.signals=SIGTERM"]
    monkeypatch.chdir(tmp_path)
    code, err = run_sweep(command), capfd.readouterr().err
    assert code == 143 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == ("sweep.py: stopped by SIGTERM with 0 trials complete "
                                            "or pruned; the same command goes on with the study")
    assert states(tmp_path, "g") == ["FAIL", "FAIL", "WAITING", "WAITING"]  # each, and its retry
    assert run_sweep(command) == 0
    trials = each_setting_complete_once(tmp_path, "g", LRS)
    assert [t.state.name for t in trials].count("FAIL") == 2
    # summary.csv is Optuna's dataframe; best.yaml trains the best trial's run again
    summary = (folder / "summary.csv").read_text().splitlines()
    assert summary[0] == "number,value,state,params_model.optimizer.lr" and len(summary) == 5
    assert sum(",FAIL," in row for row in summary) == 2
    best = study(tmp_path, "g").best_trial
    capfd.readouterr()
    assert run_sweep(command) == 0 and len(study(tmp_path, "g").get_trials()) == 4
    out = capfd.readouterr().out
    assert out.splitlines()[0] == f"Sweep g: 0 trials to run; study in sqlite:///{folder}/study.db"
    assert f"Best: trial {best.number}, val/acc_best {best.value:.4f}" in out
    monkeypatch.chdir(tmp_path / "data")
    assert run_train(["--config", str(folder / "best.yaml")]) == 0
    (replayed,) = runs(tmp_path / "data")
    (trained,) = runs(folder / f"trial_{best.number:04d}")
    assert (results(replayed)["metrics"]["val/acc_best"]
            == results(trained)["metrics"]["val/acc_best"] == best.value)


@pytest.mark.slow  # trains, in a process killed
def test_a_sampled_sweep_killed_mid_trial_runs_that_setting_again_once_its_heartbeat_is_stale(
        mnist_dir, tmp_path, monkeypatch, capfd):
    """SIGKILL (nothing of the sweep's own runs) in the first trial of a sampled sweep on SQLite;
    the same command, once three heartbeats have passed, fails that trial, runs its setting again
    and samples the rest: --trials complete, no setting sampled twice."""
    from test_postgres import start, wait_for

    (tmp_path / "space.yaml").write_text("model.optimizer.lr: {low: 1e-4, high: 1e-2, log: true}\n")
    args = ["--space", str(tmp_path / "space.yaml"), "--trials", "2", "--name", "k",
            "--heartbeat", "1", *BASE, "--data.data_dir", str(mnist_dir),
            "--trainer.callbacks+=test_sweep.Hold", f"--trainer.callbacks.flag={tmp_path / 'f'}",
            f"--trainer.callbacks.until={tmp_path / 'never'}"]
    killed = start(args, tmp_path)
    wait_for(str(tmp_path / "f"), killed, "the sweep trained no step")
    killed.kill()
    assert killed.wait() == -signal.SIGKILL
    time.sleep(3.5)  # three heartbeats
    monkeypatch.chdir(tmp_path)
    assert run_sweep(args) == 0, capfd.readouterr().err[-3000:]
    trials = study(tmp_path, "k").get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials[1].system_attrs["failed_trial"] == 0 and trials[1].params == trials[0].params
    assert trials[2].params != trials[0].params
