"""The first and last seconds of a command (issue 50): a stop while Python imports, a seed out of
range, a run's configuration edited by hand, and the record of a fit whatever its test does."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, SWEEP, TRAIN, results, run_train, runs


@pytest.mark.slow
@pytest.mark.parametrize("script", [TRAIN, SWEEP])
@pytest.mark.parametrize("signum, code, name", [(signal.SIGINT, 130, "Ctrl-C"),
                                                (signal.SIGTERM, 143, "SIGTERM")])
def test_a_stop_while_python_imports_is_one_line(script, signum, code, name, tmp_path):
    # At several moments of the imports (torch and Lightning take seconds): a stop that landed in
    # an extension module's start was lost there, and `--help` ran on to exit 0.
    for delay in (0.4, 0.5, 0.6, 1.0):
        process = subprocess.Popen([sys.executable, script, "--help"], cwd=tmp_path,
                                   env={"PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
        assert (process.returncode, delay) == (code, delay)
        assert err.strip().splitlines() == [
            f"{Path(script).name}: stopped by {name} before the command started; nothing was "
            f"written"]


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999"])
def test_a_seed_out_of_range_is_one_line(seed, capsys):
    assert run_train(["--model", "mlp", "--seed_everything", seed]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"train.py: error: --seed_everything {seed}: a seed is a whole number from 0 to "
        f"4294967295, or true for a random one")


@pytest.fixture
def finished(mnist_dir, in_tmp):
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), "--trainer.max_epochs", "1",
            "--data.batch_size", "64"]
    assert run_train(args) == 0
    return runs(in_tmp)[0]


@pytest.mark.slow
@pytest.mark.parametrize("edit, said", [("x: [\n", "is not valid YAML at line"),
                                        (None, "is not a run's configuration (a YAML mapping)")])
@pytest.mark.parametrize("command", [["test", "--ckpt_path", "best"],
                                     ["--ckpt_path", "last", "--trainer.max_epochs", "2"]])
def test_a_runs_configuration_damaged_by_hand_is_one_line(edit, said, command, finished, capsys):
    config = finished / "config.yaml"
    if edit is None:
        config.write_text("- a list, not a mapping\n")
    else:
        config.write_text(config.read_text() + edit)
    assert run_train(command) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"train.py: error: {config} {said}")


FAILING_TEST = '''
from lit_models import ImageClassifier


class FailsItsTest(ImageClassifier):
    def test_step(self, batch, batch_idx):
        raise ValueError("the test set is not what this model was trained for")
'''


@pytest.mark.slow
def test_a_fit_whose_test_fails_keeps_its_record_and_says_why(mnist_dir, own_modules,
                                                               monkeypatch, capsys):
    (own_modules / "failing.py").write_text(textwrap.dedent(FAILING_TEST))
    monkeypatch.chdir(own_modules)
    args = ["--model", "mlp", "--model", "failing.FailsItsTest", "--data.data_dir",
            str(mnist_dir), "--trainer.max_epochs", "1", "--data.batch_size", "64"]
    assert run_train(args) == 1
    (run,) = runs(own_modules)
    record = results(run)
    said = "the test set is not what this model was trained for"
    assert record["test"] == f"failed: ValueError: {said}"
    assert record["epochs"] == 1 and record["val/acc_best"] > 0.5 and record["test/acc"] is None
    assert (run / "checkpoints" / "last.ckpt").is_file()  # the fit's, kept
