"""A fit that goes on from its checkpoint with options of its own (issue 56 item 7; lit_models/
resume.py, schedules.py): the options that can apply (the learning rate, the optimizer, the
schedule, the epochs) take effect in what runs, and the record says how it went on."""

import shutil

import pytest
import torch
import yaml
from conftest import results, run_train, runs, scalars, write_mnist

PEAK = 0.015  # the MLP recipe's learning rate: OneCycle's peak

pytestmark = pytest.mark.slow  # a fit or more each: seconds


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    """A finished 2-epoch MLP run (AdamW under OneCycle, 16 steps), made once for the module."""
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


def saved(run) -> dict:
    """The run's last.ckpt."""
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def group(checkpoint: dict) -> dict:
    """The settings of the checkpoint's optimizer (its first parameter group)."""
    return checkpoint["optimizer_states"][0]["param_groups"][0]


def adams_steps(checkpoint: dict) -> float:
    """The step count in AdamW's state of the first parameter: its moments' age."""
    return float(checkpoint["optimizer_states"][0]["state"][0]["step"])


def test_more_epochs_and_a_new_learning_rate_train_on_with_a_new_cycle(finished, capsys):
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3",
                      "--model.optimizer.lr", "0.003"]) == 0
    record, after = results(finished), saved(finished)
    assert record["epochs"] == 3 and after["global_step"] == 24 and runs(finished.parent.parent)
    said = ("the optimizer's state, with the settings given now; a new OneCycle schedule from "
            "step 16 to 24")
    assert record["resumed"] == said and f"Resumed: {said}" in capsys.readouterr().err
    schedule = after["lr_schedulers"][0]
    assert schedule["total_steps"] == 8 and schedule["last_epoch"] == 8  # the new cycle, ended
    assert group(after)["max_lr"] == 0.003  # the cycle's peak: the learning rate given
    rates = scalars(finished)["lr-AdamW"]  # steps 0-15, then 16-23: two cycles
    assert len(rates) == 24 and rates[15] < 1e-4 and rates[23] < 1e-4
    assert max(rates[:16]) == pytest.approx(PEAK, rel=0.05)
    assert max(rates[16:]) == pytest.approx(0.003, rel=0.05)
    assert adams_steps(after) == 24  # AdamW's moments went on: the whole run's steps
    assert after["hyper_parameters"]["optimizer"]["init_args"]["lr"] == 0.003
    config = yaml.safe_load((finished / "config-resumed.yaml").read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.003


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


def test_a_run_trained_on_goes_on_exactly_where_its_new_cycle_stopped(finished, own_modules):
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
    assert len(rates) == 32 and max(rates[16:]) == pytest.approx(PEAK, rel=0.05)


@pytest.mark.parametrize("options", [
    ["--model.optimizer", "SGD", "--model.optimizer.momentum", "0.9"],
    # LightningCLI's own form
    ["--optimizer", "SGD", "--optimizer.lr", "0.01", "--optimizer.momentum", "0.9"],
], ids=["model.optimizer", "optimizer"])
def test_another_optimizer_on_resume_runs_new_and_is_said(options, finished):
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3", *options]) == 0
    after = saved(finished)
    assert "momentum" in group(after) and "betas" not in group(after)  # SGD's, not AdamW's
    assert results(finished)["resumed"] == (
        "a new optimizer (the checkpoint's was torch.optim.AdamW); a new OneCycle schedule "
        "from step 16 to 24")


def test_no_schedule_on_resume_trains_on_at_the_optimizers_learning_rate(finished):
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3",
                      "--model.scheduler", "null"]) == 0
    after = saved(finished)
    assert after["lr_schedulers"] == [] and group(after)["lr"] == PEAK and adams_steps(after) == 24
    assert results(finished)["resumed"] == "the optimizer's state, with the settings given now"
    rates = scalars(finished)["lr-AdamW"]
    assert len(rates) == 24 and rates[16:] == [pytest.approx(PEAK)] * 8
