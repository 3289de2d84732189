"""What a Lightning user tries works as Lightning documents it.

Each Trainer flag and callback trains ImageClassifier on tiny real data (MNIST IDX files through
torchvision) and, in the same way, a plain automatic-optimization LightningModule with the same
network, normalisation, loss, optimizer and batches: where Lightning defines the result (clipping,
accumulation, limits, weight averaging, the finders), the two end alike. Then the same flags,
callbacks and loggers from the command line.
"""

import os
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import results, run_train, runs, scalars, write_mnist
from lightning.pytorch.callbacks import (
    BatchSizeFinder,
    EarlyStopping,
    LearningRateFinder,
    ModelCheckpoint,
    StochasticWeightAveraging,
    WeightAveraging,
)
from lightning.pytorch.tuner import Tuner
from torch.optim.swa_utils import get_ema_multi_avg_fn

from datamodules import MNISTDataModule
from lit_cli import runs as run_folders
from lit_models import ImageClassifier, TutorialMLP

STEPS_PER_EPOCH = 22  # 540 training images (600 less a tenth for validation) in batches of 24


class Reference(L.LightningModule):
    """A plain LightningModule: the same MLP, normalisation (mean 0.5, std 0.5), loss and SGD."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.net = TutorialMLP((1, 28, 28), 10)
        self.lr = lr

    def forward(self, images):
        return self.net((images.to(self.dtype) / 255 - 0.5) / 0.5)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", (self(batch[0]).argmax(1) == batch[1]).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def ours() -> ImageClassifier:
    """ImageClassifier as Reference is: the MLP, mean and std 0.5, SGD at 0.05, no schedule."""
    return ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.5], std=[0.5],
                           optimizer=partial(torch.optim.SGD, lr=0.05))


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    """The tiny MNIST IDX files, shared by this module's tests."""
    return write_mnist(tmp_path_factory.mktemp("mnist"))


def fit(model_factory, data_dir, tmp_path, callbacks=(), tune=None, **flags):
    """Seed, build, fit; the trainer, the model and its data module."""
    L.seed_everything(0, verbose=False)
    model = model_factory()
    data = MNISTDataModule(str(data_dir), batch_size=24, float_images=False)  # Reference: uint8
    flags = {"max_epochs": 2, "logger": False, "enable_progress_bar": False,
             "enable_model_summary": False, "default_root_dir": str(tmp_path), **flags}
    trainer = L.Trainer(callbacks=[c() for c in callbacks], **flags)
    if tune:
        tune(trainer, model, data)
    trainer.fit(model, datamodule=data)
    return trainer, model, data


def same_weights(a, b, atol=1e-5):
    """Whether two models' networks hold the same weights, to `atol`."""
    return all(torch.allclose(x.float(), y.float(), atol=atol)
               for x, y in zip(a.net.parameters(), b.net.parameters()))


class CountValidations(L.Callback):
    """The optimizer step at each validation (sanity checks aside)."""

    def __init__(self):
        self.steps = []

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.steps.append(trainer.global_step)


@pytest.mark.parametrize("flags, steps", [
    ({}, 2 * STEPS_PER_EPOCH),
    ({"gradient_clip_val": 0.05}, 2 * STEPS_PER_EPOCH),
    ({"gradient_clip_val": 0.001, "gradient_clip_algorithm": "value"}, 2 * STEPS_PER_EPOCH),
    ({"accumulate_grad_batches": 3}, 2 * 8),  # ceil(22 / 3): the last, short group steps too
    ({"limit_train_batches": 5}, 10),
    ({"limit_train_batches": 0.5}, 22),
    ({"max_steps": 7}, 7),
    # see also test_overfit_batches_are_the_same_every_epoch
    ({"overfit_batches": 2, "max_epochs": 3}, 6),
    ({"fast_dev_run": True}, 1),
    ({"precision": "64-true"}, 2 * STEPS_PER_EPOCH),
    ({"precision": "bf16-true", "max_epochs": 1}, STEPS_PER_EPOCH),
    ({"precision": "bf16-mixed", "max_epochs": 1}, STEPS_PER_EPOCH),
])
def test_trainer_flags_train_as_a_plain_lightning_module_does(flags, steps, mnist, tmp_path):
    trainer, model, _ = fit(ours, mnist, tmp_path / "ours", **flags)
    reference_trainer, reference, _ = fit(Reference, mnist, tmp_path / "reference", **flags)
    assert trainer.global_step == reference_trainer.global_step == steps
    tolerance = 2e-2 if "bf16" in str(flags.get("precision")) else 1e-5
    assert same_weights(model, reference, tolerance)
    if flags.get("precision") in ("64-true", "bf16-true"):
        assert (model.net.fc1.weight.dtype
                == {"64-true": torch.float64, "bf16-true": torch.bfloat16}[flags["precision"]])


@pytest.mark.parametrize("flags, expected", [
    ({"val_check_interval": 5, "check_val_every_n_epoch": None, "max_steps": 24},
     [5, 10, 15, 20]),
    ({"val_check_interval": 0.5}, [11, 22, 33, 44]),
    ({"check_val_every_n_epoch": 2, "max_epochs": 4}, [44, 88]),
])
def test_validation_runs_when_lightning_says(flags, expected, mnist, tmp_path):
    counter = CountValidations()
    fit(ours, mnist, tmp_path, callbacks=[lambda: counter], **flags)
    assert counter.steps == expected


class LoggingReference(Reference):
    """The plain module, logging its training loss as Lightning's docs show."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss


class ReadMetrics(L.Callback):
    """What a user's callback finds: train/loss in callback_metrics at each epoch's end, and every
    step's loss."""

    def __init__(self):
        self.at_epoch_end, self.losses = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))

    def on_train_epoch_end(self, trainer, pl_module):
        self.at_epoch_end.append(float(trainer.callback_metrics["train/loss"]))


def test_training_metrics_are_logged_as_on_a_plain_module(mnist, tmp_path):
    """Per step at log_every_n_steps and as epoch means (Lightning's _step and _epoch), current for
    callbacks."""
    logged = {}
    for name, factory in (("ours", ours), ("reference", LoggingReference)):
        reader = ReadMetrics()
        logger = L.pytorch.loggers.TensorBoardLogger(tmp_path, name=name, version=0)
        fit(factory, mnist, tmp_path, callbacks=[lambda: reader], logger=logger,
            log_every_n_steps=5, limit_train_batches=20)
        logged[name] = scalars(tmp_path / name / "version_0"), reader
    (ours_tags, ours_read), (plain_tags, plain_read) = logged["ours"], logged["reference"]
    # 40 steps, every 5th
    assert len(ours_tags["train/loss_step"]) == len(plain_tags["train/loss_step"]) == 8
    assert len(ours_tags["train/loss_epoch"]) == len(plain_tags["train/loss_epoch"]) == 2
    assert ours_read.losses == pytest.approx(plain_read.losses, rel=1e-5)  # the same training
    # The epoch's mean over every step (not only the logged ones), there when callbacks look,
    # epoch 0 too.
    means = [sum(ours_read.losses[i:i + 20]) / 20 for i in (0, 20)]
    assert ours_tags["train/loss_epoch"] == pytest.approx(means, rel=1e-5)
    assert ours_read.at_epoch_end == pytest.approx(means, rel=1e-5) == plain_read.at_epoch_end
    # A logged step is the mean of the steps since the one before: each step's own value at
    # log_every_n_steps 1.
    assert ours_tags["train/loss_step"][1] == pytest.approx(sum(ours_read.losses[5:10]) / 5,
                                                            rel=1e-5)
    tags = scalars(fit(ours, mnist, tmp_path,
                       logger=L.pytorch.loggers.TensorBoardLogger(tmp_path, name="every"),
                       log_every_n_steps=1, limit_train_batches=20, max_epochs=1)[0].logger.log_dir)
    assert len(tags["train/loss_step"]) == 20


def test_a_checkpoint_can_monitor_the_training_loss_mid_epoch(mnist, tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="train/loss", save_top_k=-1)
    fit(ours, mnist, tmp_path, callbacks=[lambda: checkpoint], val_check_interval=0.5)
    assert (len(list((tmp_path / "ckpt").glob("*.ckpt"))) == 4
            and checkpoint.best_model_score is not None)


def ema():
    """Lightning's WeightAveraging as an EMA of decay 0.9."""
    return WeightAveraging(multi_avg_fn=get_ema_multi_avg_fn(0.9))


@pytest.mark.parametrize("callbacks", [
    [ema],
    [lambda: StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)],
    [lambda: EarlyStopping(monitor="val/acc", mode="max", patience=0, min_delta=0.5)],
])
def test_weight_averaging_and_early_stopping_as_on_a_plain_module(callbacks, mnist, tmp_path):
    trainer, model, _ = fit(ours, mnist, tmp_path / "ours", callbacks=callbacks, max_epochs=3)
    reference_trainer, reference, _ = fit(Reference, mnist, tmp_path / "reference",
                                          callbacks=callbacks, max_epochs=3)
    assert trainer.global_step == reference_trainer.global_step
    assert trainer.current_epoch == reference_trainer.current_epoch
    assert same_weights(model, reference)


def test_overfit_batches_are_the_same_every_epoch(mnist, tmp_path):
    class Batches(L.Callback):
        """The labels of each training batch."""

        def __init__(self):
            self.labels = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.labels.append(batch[1].tolist())

    seen = Batches()
    fit(ours, mnist, tmp_path, callbacks=[lambda: seen], overfit_batches=2, max_epochs=3)
    assert len(seen.labels) == 6 and seen.labels[:2] == seen.labels[2:4] == seen.labels[4:]


def test_checkpoints_every_n_train_steps(mnist, tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "every5", every_n_train_steps=5, save_top_k=-1)
    fit(ours, mnist, tmp_path, callbacks=[lambda: checkpoint], max_epochs=2)
    steps = sorted(int(p.stem.split("step=")[1]) for p in (tmp_path / "every5").glob("*.ckpt"))
    assert steps == [5, 10, 15, 20, 25, 30, 35, 40]


@pytest.mark.slow
@pytest.mark.parametrize("tune", ["callback", "tuner"])
def test_learning_rate_finder_sets_the_models_lr(tune, mnist, tmp_path):
    finder = dict(min_lr=1e-4, max_lr=1.0)
    kwargs = ({"callbacks": [lambda: LearningRateFinder(**finder, num_training_steps=20)]}
              if tune == "callback" else
              {"tune": lambda trainer, model, data: Tuner(trainer).lr_find(
                  model, datamodule=data, **finder, num_training=20)})
    _, model, _ = fit(ours, mnist, tmp_path / "ours", **kwargs)
    _, reference, _ = fit(Reference, mnist, tmp_path / "reference", **kwargs)
    assert model.lr != 0.05 and model.hparams.optimizer["init_args"]["lr"] == model.lr
    assert model.lr == pytest.approx(reference.lr)
    assert model.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(model.lr)


@pytest.mark.slow
def test_batch_size_finder_sets_the_data_modules_batch_size(mnist, tmp_path):
    finder = partial(BatchSizeFinder, mode="binsearch", steps_per_trial=1, init_val=16,
                     max_trials=3)
    trainer, _, data = fit(ours, mnist, tmp_path / "ours", callbacks=[finder])
    reference_trainer, _, reference_data = fit(Reference, mnist, tmp_path / "reference",
                                               callbacks=[finder])
    assert data.batch_size == reference_data.batch_size > 24
    assert trainer.global_step == reference_trainer.global_step == 2 * (540 // data.batch_size)


# --- the same from the command line ---------------------------------------------------------------

@pytest.fixture
def cli_run(mnist, tmp_path, monkeypatch):
    """train.py's MLP recipe on the tiny MNIST in tmp_path: 2 epochs of 22 steps, and the
    options given; its exit code."""
    monkeypatch.chdir(tmp_path)

    def run(*args):
        """The command line with `args`; its exit code."""
        # a progress bar callback needs enable_progress_bar
        quiet = not any("ProgressBar" in a for a in args)
        return run_train(["--model", "mlp", "--data.data_dir", str(mnist),
                          "--data.batch_size", "24", "--trainer.max_epochs", "2", *args],
                         quiet=quiet)
    return run


def val_acc_logged(times: int):
    """A check of a run: val/acc logged `times` times."""
    return lambda run: len(scalars(run)["val/acc"]) == times


@pytest.mark.parametrize("args, check", [
    # Flags and callbacks that can share a run: 2 epochs of 22 steps, validated every 11; the
    # default LearningRateMonitor logs every step that Lightning logs.
    (["--trainer.gradient_clip_val", "1.0", "--trainer.log_every_n_steps=5",
      "--trainer.val_check_interval", "0.5", "--trainer.profiler", "simple",
      "--trainer.callbacks+=DeviceStatsMonitor", "--trainer.callbacks+=EarlyStopping",
      "--trainer.callbacks.monitor=val/acc", "--trainer.callbacks.mode=max"],
     lambda run: len(scalars(run)["lr-AdamW"]) == 44 // 5 and val_acc_logged(4)(run)),
    # A progress bar of the user's takes the default one's place.
    (["--trainer.callbacks+=RichProgressBar"], None),
    (["--trainer.callbacks+=TQDMProgressBar", "--trainer.callbacks.refresh_rate=5"], None),
    (["--trainer.callbacks+=LearningRateFinder", "--trainer.callbacks.num_training_steps=10"],
     None),
    (["--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs=0.01",
      "--trainer.accumulate_grad_batches", "2"], lambda run: results(run)["global_step"] == 22),
    (["--trainer.enable_checkpointing", "false", "--trainer.precision", "bf16-true"],
     lambda run: not (run / "checkpoints").exists()),
    (["--trainer.overfit_batches", "2"], lambda run: results(run)["global_step"] == 4),
])
def test_command_line_flags_and_callbacks(args, check, cli_run, tmp_path):
    assert cli_run(*args) == 0
    (run,) = runs(tmp_path)
    assert results(run)["status"] == "finished"
    assert check is None or check(run)


def test_fast_dev_run_from_the_command_line_runs_a_step_and_keeps_no_run(cli_run, tmp_path):
    assert cli_run("--trainer.fast_dev_run", "true") == 0
    assert not (tmp_path / "lightning_logs").exists()


def test_default_root_dir_is_where_the_run_goes_and_where_use_commands_look(cli_run, tmp_path,
                                                                           capsys):
    assert cli_run("--trainer.default_root_dir", "elsewhere", "--trainer.max_epochs", "1") == 0
    run = tmp_path / "elsewhere" / "lightning_logs" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "lightning_logs").exists()
    capsys.readouterr()
    assert run_train(["test", "--ckpt_path", "last", "--trainer.default_root_dir", "elsewhere",
                      "--trainer.limit_test_batches", "1"]) == 0
    assert f"Using {run}/checkpoints/last.ckpt" in capsys.readouterr().out


def test_without_a_logger_checkpoints_go_to_default_root_dir(cli_run, tmp_path):
    assert cli_run("--trainer.logger", "false", "--trainer.default_root_dir", "out") == 0
    assert (tmp_path / "out" / "checkpoints" / "last.ckpt").is_file()


def test_loggers_csv_and_tensorboard_side_by_side(cli_run, tmp_path):
    """A list of loggers: CSV's (the first: the run's folder) and TensorBoard's beside it. MLflow's
    and Weights & Biases': test_bring_your_own, two runs of each."""
    both = ('--trainer.logger=[{"class_path": "CSVLogger", "init_args": {"save_dir": "both"}}, '
            '{"class_path": "TensorBoardLogger", "init_args": {"save_dir": "both"}}]')
    assert cli_run(both, "--trainer.max_epochs", "1") == 0
    run = tmp_path / "both" / "lightning_logs" / "version_0"
    assert results(run)["metrics"]["test/acc"] > 0.5
    assert Path(results(run)["log_dir"]).resolve() == run
    header = (run / "metrics.csv").read_text().splitlines()[0]
    assert "val/acc" in header and "train/loss" in header
    assert any((tmp_path / "both").glob("lightning_logs/version_*/events.out.tfevents.*"))


# --- the project's defaults step aside as Lightning's do ------------------------------------------

def test_barebones_runs_with_none_of_the_defaults_in_its_way(cli_run, tmp_path, capsys):
    assert cli_run("--trainer.barebones", "true") == 0
    # Lightning logs nothing, so there is no run folder, record or line.
    assert not any(tmp_path.glob("**/*.ckpt")) and not any(tmp_path.glob("**/config.yaml"))
    assert not any(tmp_path.glob("**/results.json")) and "on mnist:" not in capsys.readouterr().out


def test_a_users_checkpoint_callback_is_honoured_or_refused_as_lightning_does(cli_run, tmp_path,
                                                                              capsys):
    assert cli_run("--trainer.enable_checkpointing", "false",
                   "--trainer.callbacks+=ModelCheckpoint") == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "configured with `enable_checkpointing=False` but found `ModelCheckpoint`" in line
    # Their ModelCheckpoint takes the default one's place (as Lightning's own default steps aside
    # for one); the test after fit uses their best; last.ckpt is ours, as ever.
    assert cli_run("--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor=val/loss",
                   "--trainer.callbacks.filename=low-{epoch}") == 0
    (run,) = runs(tmp_path)
    best, last = sorted((p.name for p in (run / "checkpoints").iterdir()),
                        key=lambda name: name == "last.ckpt")
    assert best.startswith("low-epoch=") and last == "last.ckpt"
    record = results(run)
    assert record["best_model_path"] == record["tested"] == str(run / "checkpoints" / best)


def test_a_partial_config_goes_on_top_of_the_default_recipe(cifar10_dir, tmp_path, monkeypatch,
                                                            capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "few.yaml").write_text("trainer:\n  max_epochs: 1\n  limit_train_batches: 3\n")
    assert run_train(["--config", "few.yaml", "--data.data_dir", str(cifar10_dir)]) == 0
    (run,) = runs(tmp_path)
    record = results(run)
    assert record["network"] == "cnn" and record["data"] == "cifar10" and record["global_step"] == 3
    assert "Problem with given class_path" not in capsys.readouterr().err


def test_use_commands_find_runs_wherever_the_logger_put_them_and_make_no_new_runs(cli_run, tmp_path,
                                                                                  capsys):
    one = ["--trainer.max_epochs", "1"]
    assert cli_run(*one) == 0  # an older run, in ./lightning_logs
    assert cli_run(*one, "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "logs") == 0
    csv_run = tmp_path / "logs" / "lightning_logs" / "version_0"
    capsys.readouterr()
    assert run_train(["test", "--ckpt_path", "best"]) == 0
    assert f"Using {csv_run}/checkpoints/epoch" in capsys.readouterr().out
    # Beside the run.
    tested = csv_run / "test" / "lightning_logs" / "version_0"
    assert results(tested)["stage"] == "test" and results(csv_run)["stage"] == "fit"
    assert run_train(["predict", "--ckpt_path", "last"]) == 0
    assert run_train(["export", "--ckpt_path", "last", "--format", "torchscript"]) == 0
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"]
    assert [p.name for p in (tmp_path / "logs" / "lightning_logs").iterdir()] == ["version_0"]
    assert len(list(csv_run.glob("predictions-*.csv"))) == 1


@pytest.mark.parametrize("args, expected", [
    pytest.param(["--trainer.callbacks+=Timer", "--trainer.callbacks.duration=00:00:00:01",
                  "--trainer.max_epochs=1000"], 0),
    # Those that run can share one.
    (["--trainer.callbacks+=Timer", "--trainer.callbacks.duration=00:00:00:01",
      "--trainer.callbacks.interval=step", "--trainer.max_epochs=1000",
      "--trainer.callbacks+=GradientAccumulationScheduler", "--trainer.callbacks.scheduling={0: 2}",
      "--trainer.callbacks+=ThroughputMonitor", "--trainer.callbacks.batch_size_fn=builtins.len",
      "--trainer.callbacks+=BackboneFinetuning", "--trainer.callbacks.unfreeze_backbone_at_epoch=1",
      "--model.scheduler=null"], 0),
    (["--trainer.callbacks+=BackboneFinetuning"],
     "BackboneFinetuning adds the layers it thaws to the optimizer after"),
    (["--trainer.callbacks+=BatchSizeFinder"],
     "BatchSizeFinder changes the batches after the schedule"),
])
def test_callbacks_run_or_say_why_not(args, expected, cli_run, tmp_path, capsys):
    code = cli_run(*args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if expected == 0:
        assert code == 0 and results(runs(tmp_path)[0])["epochs"] >= 1
    else:
        assert code == 1 and expected in err.strip().splitlines()[-1]


def test_the_batch_size_finder_from_the_command_line_records_the_whole_fit(cli_run, tmp_path):
    """The finder's trials restore the trainer: the record counts the fit's own epochs and steps,
    in the batches it found (a schedule planned for other batches would be refused)."""
    assert cli_run("--trainer.callbacks+=BatchSizeFinder", "--trainer.callbacks.max_trials=2",
                   "--trainer.callbacks.init_val=32", "--trainer.callbacks.steps_per_trial=1",
                   "--model.scheduler=null") == 0
    record = results(runs(tmp_path)[0])
    # Batches of 32, then 64, fit: 2 epochs of 8 steps of 64 (in batches of 24: 22 steps).
    assert record["epochs"] == 2 and record["global_step"] == 2 * (540 // 64)


def test_last_is_the_newest_run_of_a_logger_not_a_sweeps_trial(tmp_path, monkeypatch):
    """`best`/`last`: the run (up to three folders down, wherever a logger put it) whose config or
    record was written last, not a sweep's trial deeper down; a trial's own, below it."""
    monkeypatch.chdir(tmp_path)
    folders = ["lightning_logs/version_0", "logs/lightning_logs/version_3",
               "lightning_logs/sweeps/study/trial_0000/lightning_logs/version_0"]
    for i, run in enumerate(folders):
        (tmp_path / run / "checkpoints").mkdir(parents=True)
        (tmp_path / run / "checkpoints" / "last.ckpt").write_bytes(b"")
        (tmp_path / run / "config.yaml").write_text("{}")
        os.utime(tmp_path / run / "config.yaml", (1000 + i, 1000 + i))
    found = run_folders.checkpoint("last", "test", Path("."))
    assert str(found) == "logs/lightning_logs/version_3/checkpoints/last.ckpt"
    trial = Path("lightning_logs/sweeps/study/trial_0000")
    found = run_folders.checkpoint("last", "test", trial)
    assert str(found) == f"{trial}/lightning_logs/version_0/checkpoints/last.ckpt"
