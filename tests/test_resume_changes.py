"""A fit resumed with options of its own (issues 48 and 50): training a finished run on, another
learning rate, optimizer or schedule. Each takes effect in what runs and is said in the record;
every command a message suggests works."""

import re
import shutil

import pytest
import torch
import yaml
from conftest import results, run_train, runs, scalars, write_mnist

pytestmark = pytest.mark.slow  # each test trains for seconds


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    """A finished 2-epoch MLP run (OneCycle, AdamW), made once for the module."""
    cwd = tmp_path_factory.mktemp("finished")
    args = ["--model", "mlp", "--data.data_dir", str(write_mnist(cwd / "data")),
            "--trainer.max_epochs", "2", "--data.batch_size", "64",
            "--trainer.log_every_n_steps", "1"]  # the learning rate at every step
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert run_train(args) == 0
    return cwd / "lightning_logs"


@pytest.fixture
def finished(trained_once, in_tmp):
    """A copy of that run, in this test's folder: its run folder."""
    shutil.copytree(trained_once, in_tmp / "lightning_logs")
    (run,) = runs(in_tmp)
    return run


def saved(run, name: str = "last.ckpt") -> dict:
    return torch.load(run / "checkpoints" / name, weights_only=True)


def group(checkpoint: dict) -> dict:
    return checkpoint["optimizer_states"][0]["param_groups"][0]


def test_a_finished_onecycle_run_trains_on_to_more_epochs_with_a_new_cycle(finished, capsys):
    before = saved(finished)
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3"]) == 0
    record, after = results(finished), saved(finished)
    assert record["epochs"] == 3 and after["global_step"] == 24 and runs(finished.parent.parent)
    assert record["resumed"] == ("the optimizer's state, with the settings given now; a new "
                                 "OneCycle schedule from step 16 to 24")
    assert "Resumed: the optimizer's state" in capsys.readouterr().err
    schedule = after["lr_schedulers"][0]
    assert schedule["total_steps"] == 8 and schedule["last_epoch"] == 8  # the new cycle, ended
    rates = scalars(finished)["lr-AdamW"]  # steps 0-15, then 16-23: two cycles, each to 0.015
    assert len(rates) == 24 and rates[15] < 1e-4 and rates[23] < 1e-4
    assert max(rates[:16]) == pytest.approx(0.015, rel=0.05) == max(rates[16:])
    # Adam's moments went on: its step count is the whole run's
    assert float(after["optimizer_states"][0]["state"][0]["step"]) == 24
    assert float(before["optimizer_states"][0]["state"][0]["step"]) == 16


STOP_AT = """
import os
import signal

import lightning as L


class StopAt(L.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
"""


def test_a_run_trained_on_resumes_exactly_where_its_new_cycle_stopped(finished, own_modules):
    """A SIGTERM inside the new cycle, and the same command again: the cycle as saved."""
    (own_modules / "stop_at.py").write_text(STOP_AT)
    stop = ["--trainer.callbacks+=stop_at.StopAt", "--trainer.callbacks.step", "20"]
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "4", *stop]) == 143
    assert saved(finished)["global_step"] == 20
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "4"]) == 0
    assert results(finished)["resumed"] == "the optimizer and schedule as saved"
    after = saved(finished)
    assert after["global_step"] == 32 and after["lr_schedulers"][0]["total_steps"] == 16
    rates = scalars(finished)["lr-AdamW"]
    assert len(rates) == 32 and max(rates[16:]) == pytest.approx(0.015, rel=0.05)


def test_a_new_learning_rate_on_resume_is_what_the_optimizer_runs(mnist_dir, in_tmp):
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), "--data.batch_size", "64",
            "--model.scheduler", "null", "--trainer.max_epochs", "1"]
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
    assert group(saved(run))["lr"] == 0.015
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "2",
                      "--model.lr", "0.003"]) == 0
    after = saved(run)
    assert group(after)["lr"] == 0.003 and after["hyper_parameters"]["lr"] == 0.003
    assert float(after["optimizer_states"][0]["state"][0]["step"]) == 16  # moments kept
    assert results(run)["resumed"] == "the optimizer's state, with the settings given now"
    config = yaml.safe_load((run / "config-resumed.yaml").read_text())
    assert config["model"]["init_args"]["lr"] == 0.003


def test_another_optimizer_on_resume_runs_new_and_is_said(finished):
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3",
                      "--model.optimizer", "SGD", "--model.optimizer.momentum", "0.9"]) == 0
    after = saved(finished)
    assert "momentum" in group(after) and "betas" not in group(after)  # SGD's, not AdamW's
    assert results(finished)["resumed"] == (
        "a new optimizer (the checkpoint's was torch.optim.AdamW); a new OneCycle schedule "
        "from step 16 to 24")


def test_a_finished_runs_message_suggests_commands_that_work(finished, capsys):
    assert run_train(["--ckpt_path", "last"]) == 0  # nothing left: said, and nothing written
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "finished its 2 epochs: nothing to train" in said
    assert "a larger --trainer.max_epochs trains on" in said
    test = re.search(r"train\.py (test --ckpt_path \S+) tests it again", said)[1].split()
    assert run_train(test) == 0
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3"]) == 0
    assert results(finished)["epochs"] == 3
