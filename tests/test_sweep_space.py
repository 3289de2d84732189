"""sweep.py's search space, checked before any trial: a `--space` file or `--grid` options that
Optuna cannot sample, or a command train.py refuses, are refused in one line that names the
option (exit 2), and no trial runs. In this process: quick."""

import pytest
from conftest import run_sweep

from lit_sweep import study

BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "1"]


def test_a_space_reads_1e_3_as_the_number_train_py_reads(tmp_path):
    """YAML 1.1 (PyYAML's safe_load) reads 1e-3 as a string, which Optuna cannot sample: every
    trial failed. train.py reads its configs as YAML 1.2, where it is a number."""
    (tmp_path / "s.yaml").write_text("model.optimizer.lr: {low: 1e-3, high: 5e-2, log: true}\n"
                                     "model.label_smoothing: [0, 1e-1, 2.5E-1]\n")
    assert study.read_space(str(tmp_path / "s.yaml")) == {
        "model.optimizer.lr": {"low": 0.001, "high": 0.05, "log": True},
        "model.label_smoothing": [0, 0.1, 0.25]}
    assert study.grid_space(["--model.optimizer.lr=1e-3,2E-2", "data.flip=true,false"]) == {
        "model.optimizer.lr": [0.001, 0.02], "data.flip": [True, False]}


@pytest.mark.parametrize("text, phrase", [
    ("model.lr: {low: 0.05, high: 0.001}", "model.lr: `low <= high` must hold"),
    ("model.lr: {low: 0, high: 0.1, log: true}", "model.lr: `low > 0` must hold for `log=True`"),
    ("data.batch_size: {low: 0, high: 64, log: true}", "data.batch_size: `low >= 1` must hold"),
    ("model.lr: {low: 0.01, high: 0.1, step: 0}", "model.lr: `step > 0` must hold"),
    ("model.lr: {low: 0.01, high: 0.1, step: 0.01, log: true}",
     "model.lr: The parameter `step` is not supported"),
    # Optuna would cut the range in silence
    ("model.lr: {low: 0.0, high: 1.0, step: 0.3}",
     "model.lr: The distribution is specified by [0.0, 1.0] and step=0.3, but the range is not "
     "divisible by `step`. It will be replaced with [0.0, 0.9]"),
    ("data.batch_size: {low: 32, high: 100, step: 32}",
     "data.batch_size: The distribution is specified by [32, 100] and step=32"),
    ("model.lr: {low: 0.01, high: 0.1, logg: true}", "model.lr: "),
    ("model.lr: {low: 0.01}", "model.lr: "),
    ("model.lr: {low: '1e-3', high: 0.1}", "model.lr: "),
    ("data.batch_size: {low: 32, high: 64, step: null}", "data.batch_size: "),
    ("model.label_smoothing: []", "model.label_smoothing: The `choices` must contain one or more"),
    ("model.lr: 0.01", "model.lr: "),
    ("{}", "--space s.yaml: write train.py options: ranges or lists of choices"),
    ("[a, b]", "--space s.yaml: write train.py options: ranges or lists of choices"),
    ("model.lr: [1, 2", "--space s.yaml: cannot read it (while parsing a flow sequence)"),
])
def test_a_space_optuna_cannot_sample_is_refused_in_one_line_naming_the_option(
        text, phrase, tmp_path, monkeypatch, capsys):
    (tmp_path / "s.yaml").write_text(text + "\n")
    monkeypatch.chdir(tmp_path)
    code = run_sweep(["--space", "s.yaml", *BASE])
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert code == 2 and line.startswith(f"sweep.py: error: {phrase}"), err[-2000:]
    assert not (tmp_path / "lightning_logs").exists()  # no study


@pytest.mark.parametrize("args", [
    ["--grid", "model.lr=0.01,"], ["--grid", "=0.01,0.02"], ["--grid", "model.lr"]])
def test_a_grid_with_a_value_missing_is_refused(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = run_sweep([*args, *BASE])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "sweep.py: error: --grid: write KEY=V1,V2,... with no value empty"]
    assert not (tmp_path / "lightning_logs").exists()


@pytest.mark.parametrize("args, phrase, code", [
    # as Optuna samples it, 40.5 (or 40.0): as ints, train.py took 32 and 64, and every trial
    # between failed
    (["--space", "s.yaml"], "batch_size", 2),
    (["--grid", "model.nothing=1,2"], "nothing", 2),
    (["--grid", "data.batch_size=abc"], "batch_size", 2),
    (["--grid", "model.label_smoothing=2"], "label_smoothing 2.0 must be in [0, 1]", 1),
    (["--seeds", "0"], "--trials, --seeds, --parallel and --heartbeat must be at least 1", 2),
    (["--space", "s.yaml", "--grid", "model.optimizer.lr=0.01"],
     "argument --grid: not allowed with argument --space", 2),
    (["--direction", "up"], "invalid choice: 'up'", 2),
])
def test_a_command_train_py_refuses_stops_before_any_trial(args, phrase, code, mnist_dir,
                                                           tmp_path, monkeypatch, capsys):
    """Checked with train.py's TrainCLI(run=False) on a setting of the space."""
    (tmp_path / "s.yaml").write_text("data.batch_size: {low: 32, high: 64, step: 0.5}\n")
    monkeypatch.chdir(tmp_path)
    returned = run_sweep([*args, *BASE, "--data.data_dir", str(mnist_dir)])
    err = capsys.readouterr().err
    assert returned == code and phrase in err and "Traceback" not in err, err[-2000:]
    assert not list(tmp_path.glob("lightning_logs/sweeps/*/trial_*"))
