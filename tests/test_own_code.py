"""A Lightning user's own code, whole (issue 48): their LightningModule through every subcommand,
LightningCLI's optimizer flags, training on from a finished run, records that name what ran, and
nothing left behind by a failed command."""

import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import ROOT, results, run_train, runs, scalars, write_cifar10
from test_dashboards import hparams_tab, images

from lit_models.predict import show

# A LightningModule as Lightning's docs write one: float images in, its own optimizer, logging
# what it likes (no val/acc).
LIT_MODEL = '''
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class LitModel(L.LightningModule):
    def __init__(self, hidden: int = 32, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(),
                                    nn.Linear(hidden, 10))
        self.example_input_array = torch.zeros(1, 1, 28, 28)

    def forward(self, x):
        return self.layers(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/acc", (self(x).argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class Untested(LitModel):
    test_step = None
'''

# The README's loss of one's own.
FOCAL = '''
import torch.nn.functional as F
from lit_models import ImageClassifier


class Focal(ImageClassifier):
    def training_loss(self, logits, targets):
        ce = F.cross_entropy(logits, targets, reduction="none")
        return ((1 - (-ce).exp()) ** 2 * ce).mean()
'''

SHORT = ["--trainer.max_epochs", "2", "--data.batch_size", "64"]
# What a warning, a tip or a deprecation looks like on stderr.
NOISE = re.compile(r"[Ww]arning|Tip|deprecat|\.py:\d+: ")


@pytest.fixture
def own(own_modules, monkeypatch, mnist_dir):
    """The working folder, with the user's modules on the path; MNIST's files as options."""
    (own_modules / "lit_model.py").write_text(textwrap.dedent(LIT_MODEL))
    (own_modules / "my_losses.py").write_text(textwrap.dedent(FOCAL))
    monkeypatch.chdir(own_modules)
    return SimpleNamespace(cwd=own_modules, data=["--data.data_dir", str(mnist_dir)])


@pytest.mark.slow
def test_a_lightning_module_from_lightnings_docs_runs_through_every_subcommand(own, capsys):
    data = ["--data", "mnist", *own.data]
    assert run_train(["--model", "lit_model.LitModel", *data, *SHORT]) == 0
    (run,) = runs(own.cwd)
    out = capsys.readouterr().out
    record = results(run)
    assert record["model"] == "LitModel" and record["network"] is None
    assert record["data"] == "mnist" and record["test/acc"] > 0.5 and record["test"] == "tested"
    assert "LitModel on mnist: test/acc" in out
    assert len(scalars(run)["val_loss"]) == 2  # TensorBoard, at each validation
    assert (run / "checkpoints" / "last.ckpt").is_file()
    for command in (["test"], ["validate"], ["predict"], ["export"]):
        assert run_train([*command, "--ckpt_path", "best"]) == 0, capsys.readouterr().err[-2000:]
    assert len(list(run.glob("*.onnx"))) == 1
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3"]) == 0
    assert results(run)["epochs"] == 3


def test_a_model_without_a_test_step_records_its_fit_and_says_the_test_was_skipped(own, capsys):
    assert run_train(["--model", "lit_model.Untested", "--data", "mnist", *own.data, *SHORT]) == 0
    (run,) = runs(own.cwd)
    record = results(run)
    assert record["test"] == "skipped: Untested has no test_step" and record["epochs"] == 2
    assert "Untested on mnist: test skipped: Untested has no test_step" in capsys.readouterr().out


def test_limit_test_batches_0_records_the_fit_and_says_the_test_was_skipped(own, capsys):
    args = ["--model", "mlp", *own.data, *SHORT, "--trainer.limit_test_batches", "0"]
    assert run_train(args) == 0
    record = results(runs(own.cwd)[0])
    assert record["test"].startswith("skipped: no test batches") and record["val/acc_best"] > 0.5
    assert record["test/acc"] is None and record["fit_seconds"] > 0


@pytest.mark.slow
def test_lightning_clis_optimizer_flags_are_the_models_own_with_one_learning_rate(own):
    flags = ["--optimizer", "SGD", "--optimizer.momentum", "0.9", "--lr_scheduler", "StepLR",
             "--lr_scheduler.step_size", "1"]
    assert run_train(["--model", "mlp", *own.data, *SHORT, *flags]) == 0
    (run,) = runs(own.cwd)
    config = yaml.safe_load((run / "config.yaml").read_text())
    model = config["model"]["init_args"]
    assert model["optimizer"]["class_path"] == "torch.optim.SGD"
    assert model["optimizer"]["init_args"]["momentum"] == 0.9
    assert "lr" not in model["optimizer"]["init_args"] and model["lr"] == 0.015
    assert model["scheduler"]["class_path"] == "torch.optim.lr_scheduler.StepLR"
    assert config["optimizer"] is None and config["lr_scheduler"] is None
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    group = checkpoint["optimizer_states"][0]["param_groups"][0]
    assert group["momentum"] == 0.9 and group["initial_lr"] == 0.015
    assert group["lr"] == pytest.approx(0.015 * 0.1**2)  # StepLR, stepped at each of 2 epochs


def test_lightning_clis_optimizer_flags_configure_a_users_own_module(own):
    flags = ["--optimizer", "SGD", "--optimizer.lr", "0.05"]
    assert run_train(["--model", "lit_model.LitModel", "--data", "mnist", *own.data, *SHORT,
                      *flags]) == 0
    (run,) = runs(own.cwd)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] == 0.05
    assert "momentum" in checkpoint["optimizer_states"][0]["param_groups"][0]  # SGD, not Adam


@pytest.mark.slow
def test_records_name_the_models_class_its_network_and_the_data(own, capsys):
    assert run_train(["--model", "mlp", "--model", "my_losses.Focal", *own.data, *SHORT]) == 0
    (run,) = runs(own.cwd)
    record = results(run)
    assert (record["model"], record["network"], record["data"]) == ("Focal", "mlp", "mnist")
    assert "Focal(mlp) on mnist: test/acc" in capsys.readouterr().out
    values, _ = hparams_tab(run)
    assert values["Model"] == "Focal" and values["Network"] == "TutorialMLP"


def test_a_subclass_alone_gets_the_default_recipe_beneath_it(own, capsys):
    """As the README writes it: `--model my_losses.Focal`, the recipe's settings apply to it."""
    cifar10 = write_cifar10(own.cwd / "cifar10")
    args = ["--model", "my_losses.Focal", "--data.data_dir", str(cifar10),
            "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1"]
    assert run_train(args) == 0, capsys.readouterr().err[-2000:]
    assert "Focal(cnn) on cifar10: test/acc" in capsys.readouterr().out


def test_a_users_module_without_data_is_told_to_give_data(own, capsys):
    assert run_train(["--model", "lit_model.LitModel"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("train.py: error: LitModel has no data: give --data NAME (cifar10, ")
    assert not (own.cwd / "lightning_logs").exists()


# --- nothing left behind, nothing noisy
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_failed_command_leaves_no_run_folder_and_no_file_in_the_run_it_resumed(own, capsys):
    big = ["--data.batch_size", "100000"]  # refused in the fit's set-up, once its run is claimed
    assert run_train(["--model", "mlp", *own.data, *big]) == 1
    assert "not one full batch" in capsys.readouterr().err
    assert not (own.cwd / "lightning_logs").exists()
    assert run_train(["--model", "mlp", *own.data, *SHORT]) == 0
    (run,) = runs(own.cwd)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3", *big]) == 1
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert run_train(["test", "--ckpt_path", "last", "--data.eval_batch_size", "0"]) == 1
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_fast_dev_run_writes_nothing_outside_a_run_folder(own, capsys):
    args = ["--model", "mlp", *own.data, "--data.batch_size", "64"]
    assert run_train([*args, "--trainer.fast_dev_run", "true"]) == 0
    assert "; no logger" in capsys.readouterr().out
    assert sorted(p.name for p in own.cwd.iterdir()) == ["data", "lit_model.py", "my_losses.py"]


def test_the_tutorial_recipe_keeps_the_dashboards(own):
    args = ["--config", str(ROOT / "configs" / "tutorial_mlp.yaml"), *own.data,
            "--trainer.max_steps", "3"]
    assert run_train(args) == 0
    (run,) = runs(own.cwd)
    values, _ = hparams_tab(run)
    assert values["Network"] == "TutorialMLP" and values["Optimizer"] == "Adam"
    assert {"test/predictions", "test/confusion_matrix"} <= set(images(run))


def test_predict_shows_each_image_once(capsys):
    for n in (1, 5, 8, 20):
        writer = SimpleNamespace(labelled=False, rows=[[f"{i}.png", "a", "0.9"] for i in range(n)])
        show(writer, ["a", "b"])
        shown = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
        assert len(shown) == len(set(shown)) == min(n, 8)


# train.py's commands one after another in one fresh interpreter, as a user runs them: what they
# write to stderr, the warnings Python and Lightning print included.
COMMANDS_IN_A_PROCESS = """
import sys
import train
for command in sys.argv[1].split(" -- "):
    assert train.main(command.split()) == 0, command
"""


@pytest.mark.slow
def test_a_default_run_prints_no_warning_a_user_can_do_nothing_about(own):
    """A fit and its test, training it on, and a predict: Lightning's informative lines, no
    warnings, tips or deprecations."""
    commands = [["--model", "mlp", *own.data, *SHORT],
                ["--ckpt_path", "last", "--trainer.max_epochs", "3"],
                ["predict", "--ckpt_path", "best"]]
    done = subprocess.run([sys.executable, "-c", COMMANDS_IN_A_PROCESS,
                           " -- ".join(" ".join(c) for c in commands)], cwd=own.cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if NOISE.search(line)] == []
    assert "Resumed:" in done.stderr and "Predicted" in done.stdout  # all three ran
