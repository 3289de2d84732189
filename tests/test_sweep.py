"""sweep.py: an Optuna study of train.py runs, read back with Optuna's own API."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import ROOT, SWEEP, run_process, run_train, runs

BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "2"]

pytestmark = pytest.mark.slow  # processes and signals: seconds each


def sweep(args, cwd, data, **kwargs):
    proc = run_process([*args, *BASE, "--data.data_dir", str(data)], cwd=cwd, script=SWEEP, quiet=False, **kwargs)
    return proc


def study(cwd) -> optuna.Study:
    (db,) = (cwd / "lightning_logs" / "sweeps").glob("*/study.db")
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    return optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A grid of two settings, two seeds each, in two processes."""
    from conftest import write_mnist

    cwd = tmp_path_factory.mktemp("grid")
    data = write_mnist(cwd / "data")
    proc = sweep(["--grid", "model.lr=0.005,0.02", "--seeds", "2", "--parallel", "2", "--name", "g"], cwd, data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, data, proc


def test_a_grid_runs_each_setting_once_with_each_seed(grid):
    cwd, _, proc = grid
    trials = study(cwd).get_trials()
    assert sorted(t.params["model.lr"] for t in trials) == [0.005, 0.02]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    for t in trials:  # the value is the mean over the seeds' val/acc_best
        runs_ = [cwd / "lightning_logs" / "sweeps" / "g" / f"trial_{t.number:04d}" / f"seed_{s}" for s in (0, 1)]
        bests = [yaml.safe_load((r / "lightning_logs" / "version_0" / "results.json").read_text())["val/acc_best"]
                 for r in runs_]
        assert t.value == pytest.approx(sum(bests) / 2)
        command = t.user_attrs["command_seed_1"]
        assert command.endswith(f"--model.lr={t.params['model.lr']} --seed_everything=1")
    assert "Best: trial" in proc.stdout


def test_summary_csv_is_optunas_dataframe_and_best_yaml_replays(grid, tmp_path, monkeypatch):
    cwd, data, _ = grid
    folder = cwd / "lightning_logs" / "sweeps" / "g"
    summary = (folder / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("number,value,") and "params_model.lr" in summary[0] and len(summary) == 3
    best = study(cwd).best_trial
    monkeypatch.chdir(tmp_path)
    assert run_train(["--config", str(folder / "best.yaml")]) == 0
    (replayed,) = runs(tmp_path)
    first_seed = yaml.safe_load((folder / f"trial_{best.number:04d}" / "seed_0" / "lightning_logs" / "version_0" /
                                 "results.json").read_text())
    assert yaml.safe_load((replayed / "results.json").read_text())["val/acc_best"] == first_seed["val/acc_best"]


def test_the_same_command_again_runs_nothing_and_optuna_reads_the_study(grid):
    cwd, data, _ = grid
    proc = sweep(["--grid", "model.lr=0.005,0.02", "--seeds", "2", "--parallel", "2", "--name", "g"], cwd, data)
    assert proc.returncode == 0 and len(study(cwd).get_trials()) == 2
    (db,) = (cwd / "lightning_logs" / "sweeps").glob("*/study.db")
    listed = subprocess.run([str(Path(sys.executable).parent / "optuna"), "trials", "--study-name", "g", "--storage",
                             f"sqlite:///{db}", "-f", "json"], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.count('"number"') == 2


def test_a_space_samples_prunes_and_keeps_count(mnist_dir, tmp_path):
    (tmp_path / "space.yaml").write_text("model.lr: {low: 0.001, high: 0.1, log: true}\n"
                                         "data.batch_size: [32, 64]\n")
    proc = sweep(["--space", "space.yaml", "--trials", "6", "--trainer.max_epochs", "4"], tmp_path, mnist_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = study(tmp_path).get_trials()
    assert len(trials) == 6 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    assert all(0.001 <= t.params["model.lr"] <= 0.1 and t.params["data.batch_size"] in (32, 64) for t in trials)
    assert all(len(t.intermediate_values) >= 1 for t in trials)  # each epoch's val/acc reported


def test_a_failing_trial_fails_alone(mnist_dir, tmp_path):
    proc = sweep(["--grid", "model.lr=1e12,0.01", "--name", "nan"], tmp_path, mnist_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = {t.params["model.lr"]: t.state.name for t in study(tmp_path).get_trials()}
    assert states == {1e12: "FAIL", 0.01: "COMPLETE"}


@pytest.mark.parametrize("args, phrase", [
    (["--space", "nothing.yaml"], "--space nothing.yaml: cannot read it"),
    (["--grid", "model.lr"], "--grid model.lr: write KEY=V1,V2"),
    (["--grid", "model.nothing=1,2"], "nothing"),
    (["--seeds", "0"], "must be at least 1"),
])
def test_bad_sweeps_stop_before_any_trial(args, phrase, mnist_dir, tmp_path):
    proc = sweep(args, tmp_path, mnist_dir)
    assert proc.returncode == 2 and phrase in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("lightning_logs/sweeps/*/trial_*"))


def test_a_stopped_sweep_goes_on_without_losing_or_repeating_a_trial(mnist_dir, tmp_path):
    args = [sys.executable, SWEEP, "--grid", "model.lr=0.005,0.01,0.02", "--name", "s", *BASE,
            "--trainer.max_epochs", "30", "--data.data_dir", str(mnist_dir)]
    env = {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=tmp_path, env={**__import__("os").environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    time.sleep(1)
    while not list(tmp_path.glob("lightning_logs/sweeps/s/trial_0001/**/checkpoints/last.ckpt")):
        time.sleep(0.2)  # the second trial has trained an epoch
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    states = sorted(t.state.name for t in study(tmp_path).get_trials())
    assert states == ["COMPLETE", "FAIL", "WAITING"]  # the interrupted trial, and its retry
    again = subprocess.run(args[:-4] + ["--trainer.max_epochs", "2", "--data.data_dir", str(mnist_dir)], cwd=tmp_path,
                           env={**__import__("os").environ, **env}, capture_output=True, text=True)
    assert again.returncode == 2 and "was made by another command" in again.stderr
    again = subprocess.run(args, cwd=tmp_path, env={**__import__("os").environ, **env}, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    trials = study(tmp_path).get_trials()
    complete = sorted(t.params["model.lr"] for t in trials if t.state.name == "COMPLETE")
    assert complete == [0.005, 0.01, 0.02]
