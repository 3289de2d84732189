"""A Lightning user's own code, whole (issue 48): their LightningModule through every subcommand,
records and summary lines under the names it logs (issue 56, defect 2), LightningCLI's
`--optimizer` and `--lr_scheduler` as LightningCLI documents them (defect 6), subclasses of the
model on a recipe, and what a failed command leaves behind."""

import re
import textwrap
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import ROOT, results, run_in_terminal, run_train, runs, scalars
from lightning.pytorch.core.saving import load_hparams_from_yaml

from lit_models.predict import report

# A LightningModule as Lightning's docs write one: float images in, its own optimizer, logging
# what it likes under its own names (val_acc, test_acc: no val/acc).
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

    def evaluate(self, batch, stage):
        x, y = batch
        logits = self(x)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y))
        self.log(f"{stage}_acc", (logits.argmax(1) == y).float().mean())

    def validation_step(self, batch, batch_idx):
        self.evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self.evaluate(batch, "test")

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class Untested(LitModel):
    test_step = None


class LossesOnly(LitModel):
    def evaluate(self, batch, stage):
        x, y = batch
        self.log(f"{stage}_loss", F.cross_entropy(self(x), y))


class Automatic(LitModel):
    """As LightningCLI's docs leave configure_optimizers to --optimizer and --lr_scheduler."""

    configure_optimizers = L.LightningModule.configure_optimizers
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
# What a warning or a deprecation looks like on stderr.
NOISE = re.compile(r"[Ww]arning|deprecat|\.py:\d+: ")


@pytest.fixture
def own(own_modules, monkeypatch, mnist_dir):
    """The working folder, with the user's modules on the path; MNIST's files as options."""
    (own_modules / "lit_model.py").write_text(textwrap.dedent(LIT_MODEL))
    (own_modules / "my_losses.py").write_text(textwrap.dedent(FOCAL))
    monkeypatch.chdir(own_modules)
    return SimpleNamespace(cwd=own_modules, data=["--data.data_dir", str(mnist_dir)])


def fit_own(own, model: str, *args: str) -> int:
    """A fit of the user's module `model` (lit_model.py) on MNIST; its exit code."""
    return run_train(["--model", f"lit_model.{model}", "--data", "MNISTDataModule", *own.data,
                      *SHORT, *args])


def hparams(run) -> dict:
    """The run's hparams.yaml, as Lightning reads it (tuples and all)."""
    return load_hparams_from_yaml(str(run / "hparams.yaml"))


def last_checkpoint(run) -> dict:
    """The run's last.ckpt."""
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def test_a_modules_metrics_are_recorded_and_said_under_its_own_names(own, capsys):
    """Defect 2: a module as Lightning's docs write one logs val_acc and test_acc; its record held
    `"test/acc": null` and its line said "test/acc not logged (no validation)", though it had
    validated."""
    assert fit_own(own, "LitModel") == 0
    (run,) = runs(own.cwd)
    record = results(run)
    metrics = record["metrics"]
    assert metrics["test_acc"] > 0.5 and metrics["val_acc"] > 0.5 and "test/acc" not in metrics
    assert {"train_loss", "val_loss", "test_loss"} <= set(metrics)
    assert (record["model"], record["network"], record["data"]) == ("LitModel", None, "mnist")
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("LitModel on")]
    assert line.startswith(f"LitModel on mnist: test_acc {metrics['test_acc']:.4f}, val_acc "
                           f"{metrics['val_acc']:.4f} after 2 epochs")
    assert "not logged" not in line and len(scalars(run)["val_acc"]) == 2


@pytest.mark.parametrize("model, said, absent", [
    ("Untested", "val_acc", "test"),  # no test step: no test; the line names what it validated
    ("LossesOnly", "test_loss", "test_acc"),  # no accuracy logged: the line names its losses
])
def test_the_summary_line_names_the_metrics_that_exist(model, said, absent, own, capsys):
    assert fit_own(own, model) == 0
    record = results(runs(own.cwd)[0])
    assert record["epochs"] == 2 and record["status"] == "finished"
    assert not any(name.startswith(absent) for name in record["metrics"])
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith(f"{model} on")]
    assert f"{model} on mnist: {said} {record['metrics'][said]:.4f}" in line
    assert "after 2 epochs" in line


@pytest.mark.slow
def test_a_lightning_module_from_lightnings_docs_runs_through_every_subcommand(own, capsys):
    """Test, validate, predict (its predictions to a file, said in a line) and export of the
    run's checkpoint, and the fit gone on with."""
    assert fit_own(own, "LitModel") == 0
    (run,) = runs(own.cwd)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    for command in (["test"], ["validate"], ["export", "--format", "torchscript"]):
        assert run_train([*command, "--ckpt_path", str(run)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert run_train(["predict", "--ckpt_path", "last"]) == 0
    (written,) = run.glob("predictions-*.pt")
    assert f"wrote {written}" in capsys.readouterr().out
    predictions = torch.load(written, weights_only=True)
    assert sum(len(batch) for batch in predictions) == 200  # the test split, a class each
    assert len(list(run.glob("*.pt"))) == 2  # the predictions and the export
    tested = results(run / "test" / "lightning_logs" / "version_0")
    assert tested["stage"] == "test" and tested["metrics"]["test_acc"] > 0.5
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3"]) == 0
    assert results(run)["epochs"] == 3


def test_limit_test_batches_0_records_the_fit_without_a_test(own):
    assert run_train(["--model", "mlp", *own.data, *SHORT, "--trainer.limit_test_batches",
                      "0"]) == 0
    record = results(runs(own.cwd)[0])
    assert record["metrics"]["val/acc_best"] > 0.5 and "test/acc" not in record["metrics"]
    assert record["fit_seconds"] > 0 and record["stage"] == "fit"


# --- LightningCLI's --optimizer and --lr_scheduler (defect 6) -------------------------------------

def lrs(config) -> list:
    """Every `lr` setting in a configuration (nested dicts and lists)."""
    if isinstance(config, dict):
        return [v for k, v in config.items() if k == "lr"] + lrs(list(config.values()))
    if isinstance(config, list):
        return [lr for value in config for lr in lrs(value)]
    return []


def test_optimizer_flags_on_a_recipe_train_at_the_rate_given_recorded_once(own):
    """Defect 6: `--optimizer Adam --optimizer.lr 0.002`, LightningCLI's documented form, was
    refused on a recipe, naming `--model.optimizer.lr`, which the user had not typed."""
    assert run_train(["--model", "mlp", *own.data, *SHORT, "--optimizer", "Adam",
                      "--optimizer.lr", "0.002"]) == 0
    (run,) = runs(own.cwd)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["optimizer"]["class_path"] == "torch.optim.Adam"
    assert config["optimizer"] is None and lrs(config) == [0.002]
    assert lrs(hparams(run)) == [0.002]
    group = last_checkpoint(run)["optimizer_states"][0]["param_groups"][0]
    assert group["max_lr"] == 0.002  # the recipe's OneCycle, peaking at the rate given
    assert "decoupled_weight_decay" in group  # Adam's, not the recipe's AdamW


def test_lr_scheduler_flags_on_a_recipe_keep_their_monitor(own):
    """Defect 6: `--lr_scheduler ReduceLROnPlateau --lr_scheduler.monitor val/loss` ended in "The
    lr scheduler dict must include a monitor": the monitor was lost."""
    assert run_train(["--model", "mlp", *own.data, *SHORT, "--lr_scheduler", "ReduceLROnPlateau",
                      "--lr_scheduler.monitor", "val/loss", "--lr_scheduler.patience", "0"]) == 0
    (run,) = runs(own.cwd)
    config = yaml.safe_load((run / "config.yaml").read_text())
    scheduler = config["model"]["init_args"]["scheduler"]
    assert scheduler["class_path"].endswith("ReduceLROnPlateau") and config["lr_scheduler"] is None
    assert scheduler["init_args"]["monitor"] == "val/loss"
    (state,) = last_checkpoint(run)["lr_schedulers"]
    assert state["best"] == pytest.approx(min(scalars(run)["val/loss"]))  # stepped on val/loss


def test_an_optimizer_and_an_epoch_schedule_from_lightning_clis_flags_on_a_recipe(own):
    """SGD starts from its own defaults (lr 0.001), not the recipe's AdamW settings; StepLR steps
    at each epoch's end."""
    flags = ["--optimizer", "SGD", "--optimizer.momentum", "0.9", "--lr_scheduler", "StepLR",
             "--lr_scheduler.step_size", "1"]
    assert run_train(["--model", "mlp", *own.data, *SHORT, *flags]) == 0
    (run,) = runs(own.cwd)
    group = last_checkpoint(run)["optimizer_states"][0]["param_groups"][0]
    assert (group["momentum"], group["initial_lr"]) == (0.9, 0.001)
    assert group["lr"] == pytest.approx(0.001 * 0.1**2)  # stepped at each of 2 epochs
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["optimizer"] is None and config["lr_scheduler"] is None
    assert config["model"]["init_args"]["scheduler"]["class_path"].endswith("StepLR")
    assert lrs(config) == [0.001]


@pytest.mark.parametrize("model, args, lr", [
    ("Automatic", ["--optimizer", "SGD", "--optimizer.lr", "0.05", "--lr_scheduler", "StepLR",
                   "--lr_scheduler.step_size", "1"], 0.05 * 0.1**2),
    # Their own configure_optimizers: LightningCLI's flags replace it, as it documents.
    ("LitModel", ["--optimizer", "SGD", "--optimizer.lr", "0.05"], 0.05),
])
def test_lightning_clis_optimizer_flags_configure_a_users_own_module(model, args, lr, own):
    assert fit_own(own, model, *args) == 0
    (run,) = runs(own.cwd)
    checkpoint = last_checkpoint(run)
    group = checkpoint["optimizer_states"][0]["param_groups"][0]
    assert group["lr"] == pytest.approx(lr) and "dampening" in group  # SGD, not Adam
    assert len(checkpoint["lr_schedulers"]) == ("--lr_scheduler" in args)


# --- the project's model, subclassed ----------------------------------------------------------

def test_a_subclass_after_a_recipe_keeps_the_recipe_and_its_record_names_it(own, capsys):
    """`--model mlp --model my_losses.Focal`: the recipe's settings apply to the subclass (the
    README's loss of one's own); the record names its class, network and data."""
    assert run_train(["--model", "mlp", "--model", "my_losses.Focal", *own.data, *SHORT]) == 0
    (run,) = runs(own.cwd)
    record = results(run)
    assert (record["model"], record["network"], record["data"]) == ("Focal", "mlp", "mnist")
    assert "Focal(mlp) on mnist: test/acc" in capsys.readouterr().out
    model = yaml.safe_load((run / "config.yaml").read_text())["model"]
    assert model["class_path"] == "my_losses.Focal" and model["init_args"]["label_smoothing"] == 0.1
    assert lrs(model) == [0.015]
    assert hparams(run)["net"]["class_path"] == "lit_models.TutorialMLP"
    cnn = yaml.safe_load((ROOT / "configs" / "cnn.yaml").read_text())["model"]["init_args"]
    capsys.readouterr()
    assert run_train(["--model", "cnn", "--model", "my_losses.Focal", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == "my_losses.Focal"
    given = printed["model"]["init_args"]
    assert (given["flip_test"], given["label_smoothing"]) == (True, 0.1)
    assert given["optimizer"]["init_args"]["lr"] == cnn["optimizer"]["init_args"]["lr"]
    assert printed["data"]["class_path"] == "datamodules.CIFAR10DataModule"


def test_a_users_module_without_data_is_told_to_give_data(own, capsys):
    assert run_train(["--model", "lit_model.LitModel"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("train.py: error: LitModel has no data: give --data and a "
                           "LightningDataModule")
    assert not (own.cwd / "lightning_logs").exists()


# --- what a failed command leaves, nothing noisy
# -----------------------------------------------------------------------------------------


def test_a_command_that_fails_before_its_trainer_leaves_nothing_and_a_failed_resume_keeps_the_run(
        own, capsys):
    """A parse error writes nothing; a resume refused as its batches are made writes no record
    over the run's, and keeps its checkpoints."""
    assert run_train(["--model", "mlp", *own.data, "--data.batch_size", "-1"]) == 1
    assert "--data.batch_size -1" in capsys.readouterr().err
    assert not (own.cwd / "lightning_logs").exists()
    assert run_train(["--model", "mlp", *own.data, *SHORT]) == 0
    (run,) = runs(own.cwd)
    record = (run / "results.json").read_text()
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    big = ["--data.batch_size", "100000"]
    assert run_train(["--ckpt_path", "last", "--trainer.max_epochs", "3", *big]) == 1
    assert "not one full batch" in capsys.readouterr().err
    assert (run / "results.json").read_text() == record
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints


def test_fast_dev_run_writes_nothing_outside_a_run_folder(own, capsys):
    args = ["--model", "mlp", *own.data, "--data.batch_size", "64"]
    assert run_train([*args, "--trainer.fast_dev_run", "true"]) == 0
    assert sorted(p.name for p in own.cwd.iterdir()) == ["data", "lit_model.py", "my_losses.py"]


def test_the_tutorial_recipe_keeps_the_dashboards(own):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = ["--config", str(ROOT / "configs" / "tutorial_mlp.yaml"), *own.data,
            "--trainer.max_steps", "3"]
    assert run_train(args) == 0
    (run,) = runs(own.cwd)
    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    assert {"test/predictions", "test/confusion_matrix"} <= set(events.Tags()["images"])
    logged = hparams(run)
    assert logged["net"]["class_path"] == "lit_models.TutorialMLP"
    assert logged["optimizer"]["class_path"] == "torch.optim.Adam"


def test_predict_shows_each_image_once(capsys):
    for n in (1, 5, 8, 20):
        rows = [[f"{i}.png", "a", "0.9"] for i in range(n)]
        writer = SimpleNamespace(labelled=False, rows=rows, class_names=["a", "b"], seen=n,
                                 failures=[])
        report(writer, "out.csv", 1.0, "cpu")
        *shown, last = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
        assert len(shown) == len(set(shown)) == min(n, 8) and last == "Predicted"


# train.py's commands one after another in one fresh interpreter, as a user runs them: what they
# write, the warnings Python and Lightning print included.
COMMANDS_IN_A_PROCESS = """
import sys
import train
for command in sys.argv[1].split(" -- "):
    assert train.main(command.split()) == 0, command
"""


def test_default_runs_in_a_terminal_show_the_bar_and_no_warning_a_user_can_do_nothing_about(own):
    """A fit and its test, training it on, and a predict, at a terminal: Lightning's progress bar
    and informative lines, the run's line, and no warnings or deprecations."""
    (own.cwd / "commands.py").write_text(COMMANDS_IN_A_PROCESS)
    commands = [["--model", "mlp", *own.data, "--data.batch_size", "64"],
                ["--ckpt_path", "last", "--trainer.max_epochs", "2"],
                ["predict", "--ckpt_path", "best"]]
    commands[0] += ["--trainer.max_epochs", "1"]
    code, output = run_in_terminal([" -- ".join(" ".join(c) for c in commands)], cwd=own.cwd,
                                   script=str(own.cwd / "commands.py"))
    assert code == 0, output[-2000:]
    assert "Epoch 0" in output and "Epoch 1" in output and "val/acc" in output
    assert "ImageClassifier(mlp) on mnist: test/acc" in output
    assert "Resuming" in output and "Predicted" in output  # all three ran
    assert "Traceback" not in output
    assert [line for line in output.splitlines() if NOISE.search(line)] == []
