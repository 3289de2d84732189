"""sweep.py's search space, checked before any trial: a `--space` file or `--grid` options that
Optuna cannot sample, or that the sweep would replace, are refused in one line that names the
option (exit 2), and no worker starts. In this process: quick."""

import pytest
from conftest import run_sweep

import sweep
import sweep_workers

BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "1"]


@pytest.fixture
def no_workers(monkeypatch) -> list:
    """The sweep's workers, never started: what a sweep would have started them with, if it did."""
    started = []
    monkeypatch.setattr(sweep_workers, "run_workers", lambda stop, shares: started.append(shares))
    return started


def test_a_space_reads_1e_3_as_the_number_train_py_reads(tmp_path):
    """YAML 1.1 (PyYAML's safe_load) reads 1e-3 as a string, which Optuna cannot sample: every
    trial failed. train.py reads its configs as YAML 1.2, where it is a number."""
    (tmp_path / "s.yaml").write_text("model.lr: {low: 1e-3, high: 5e-2, log: true}\n"
                                     "model.label_smoothing: [0, 1e-1, 2.5E-1]\n")
    opts, _ = sweep.parse(["--space", str(tmp_path / "s.yaml")])
    space = sweep.search_space(opts)
    assert space == {"model.lr": {"low": 0.001, "high": 0.05, "log": True},
                     "model.label_smoothing": [0, 0.1, 0.25]}


@pytest.mark.parametrize("text, phrase", [
    ("model.lr: {low: 0.05, high: 0.001}", "model.lr: `low <= high` must hold"),
    ("model.lr: {low: 0, high: 0.1, log: true}", "model.lr: `low > 0` must hold for `log=True`"),
    ("data.batch_size: {low: 0, high: 64, log: true}", "data.batch_size: `low >= 1` must hold"),
    ("model.lr: {low: 0.01, high: 0.1, step: 0}", "model.lr: `step > 0` must hold"),
    ("model.lr: {low: 0.01, high: 0.1, step: 0.01, log: true}",
     "model.lr: The parameter `step` is not supported"),
    ("model.lr: {low: 0.0, high: 1.0, step: 0.3}",
     "model.lr: high 1.0 is not low plus a multiple of step 0.3 (Optuna would sample up to 0.9)"),
    ("data.batch_size: {low: 32, high: 100, step: 32}", "data.batch_size: high 100 is not low"),
    ("model.lr: {low: 0.01, high: 0.1, logg: true}", "model.lr: unknown key 'logg'"),
    ("model.lr: {low: 0.01}", "model.lr: a range needs low and high"),
    ("model.lr: {low: '1e-3', high: 0.1}", "model.lr: low must be a finite number, not '1e-3'"),
    ("model.lr: {low: 0.01, high: .inf}", "model.lr: high must be a finite number, not inf"),
    ("data.batch_size: {low: 32, high: 64, step: null}",
     "data.batch_size: step must be a finite number, not None"),
    ("model.lr: {low: true, high: 1}", "model.lr: low must be a finite number, not True"),
    ("model.lr: {low: 0.01, high: 0.1, log: 'yes'}", "model.lr: log must be true or false"),
    ("model.label_smoothing: []", "model.label_smoothing: an empty list"),
    ("model.label_smoothing: [0.1, 0.2, 0.1]", "model.label_smoothing: 0.1 is given twice"),
    ("model.lr: 0.01", "model.lr: 0.01 is neither a range {low, high} nor a list"),
    ("1: [1, 2]", "1 is not the name of an option"),
    ("{}", "a mapping of train.py options"),
    ("seed_everything: [1, 2]", "seed_everything: the sweep sets it in every trial (--seeds N"),
    ("trainer.default_root_dir: [a, b]", "trainer.default_root_dir: the sweep sets it"),
    ("model.lr: [0.01]\n--model.lr: [0.02]", "model.lr is given twice"),
])
def test_a_space_optuna_cannot_sample_is_refused_in_one_line_naming_the_option(
        text, phrase, mnist_dir, tmp_path, monkeypatch, capsys, no_workers):
    (tmp_path / "s.yaml").write_text(text + "\n")
    monkeypatch.chdir(tmp_path)
    code = run_sweep(["--space", "s.yaml", *BASE, "--data.data_dir", str(mnist_dir)])
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert code == 2 and line.startswith(f"sweep.py: error: --space s.yaml: {phrase}"), err[-2000:]
    assert not no_workers
    assert not (tmp_path / "lightning_logs").exists()  # no study either


@pytest.mark.parametrize("args, phrase", [
    (["--grid", "model.lr=0.01", "--grid", "model.lr=0.02"], "--grid model.lr is given twice"),
    (["--grid", "model.lr=0.01,0.02,0.01"], "--grid model.lr: 0.01 is given twice"),
    (["--grid", "model.lr=0.01,"], "--grid model.lr=0.01,: a value is empty"),
    (["--grid", "=0.01,0.02"], "--grid =0.01,0.02: write KEY=V1,V2"),
    (["--grid", "seed_everything=1,2"], "--grid seed_everything: the sweep sets it"),
])
def test_a_grid_that_would_run_a_setting_twice_or_replace_an_option_is_refused(
        args, phrase, mnist_dir, tmp_path, monkeypatch, capsys, no_workers):
    monkeypatch.chdir(tmp_path)
    code = run_sweep([*args, *BASE, "--data.data_dir", str(mnist_dir)])
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert code == 2 and line.startswith(f"sweep.py: error: {phrase}"), err[-2000:]
    assert not no_workers


def test_a_float_range_over_an_option_of_ints_is_refused_before_any_trial(mnist_dir, tmp_path,
                                                                        monkeypatch, capsys,
                                                                        no_workers):
    """Its ends are checked as Optuna samples them, 32.0 and 64.0: as ints (32 and 64), train.py
    took them, and every trial between failed (a batch size of 40.5)."""
    (tmp_path / "s.yaml").write_text("data.batch_size: {low: 32, high: 64, step: 0.5}\n")
    monkeypatch.chdir(tmp_path)
    code = run_sweep(["--space", "s.yaml", *BASE, "--data.data_dir", str(mnist_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "batch_size" in err and not no_workers, err[-2000:]
