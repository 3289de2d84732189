"""The upstream behaviours that docs/design.md's departures from plain Lightning answer, each
asserted as it is today: a test here fails when upstream moves, and the departure is then to be
revisited (removed where upstream fixed it, mended where it changed)."""

import sys

import lightning as L
import pytest
import torch
import yaml
from conftest import ROOT
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel


def plain_cli(args: list[str], **kwargs) -> LightningCLI:
    """LightningCLI as shipped, on the project's classes, built but not run."""
    return LightningCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True,
                        subclass_mode_data=True, run=False, save_config_callback=None,
                        args=args, **kwargs)


def test_jsonargparse_carries_a_configs_settings_to_another_class(tmp_path):
    """omni-us/jsonargparse#460: a class named after a config keeps the settings the config gave
    another class (the MLP recipe's batch of 1536 reaches CIFAR-10); command_line.from_own_defaults
    resets them."""
    cli = plain_cli(["--config", str(ROOT / "configs" / "mlp.yaml"), "--data",
                     "CIFAR10DataModule", "--trainer.logger", "false"])
    assert cli.config.data.init_args.batch_size == 1536


def test_lightningclis_schedules_step_once_an_epoch():
    """Lightning-AI/pytorch-lightning#15340: LightningCLI's own configure_optimizers steps any
    scheduler but ReduceLROnPlateau once an epoch, with no way to step it every step: OneCycle over
    the run needs the model's own (command_line.lightnings_flags_as_the_models)."""
    model = BoringModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    configured = LightningCLI.configure_optimizers(model, optimizer, scheduler)
    assert configured == ([optimizer], [scheduler])


def test_lightningcli_puts_a_checkpoints_hyperparameters_over_the_command_line(tmp_path):
    """Lightning-AI/pytorch-lightning#21455: LightningCLI's _parse_ckpt_path replaces an option
    the user gave a use command with the checkpoint's; train.py's override does nothing there."""

    class Flagged(BoringModel):
        def __init__(self, flag: bool = False):
            super().__init__()
            self.save_hyperparameters()

    sys.modules[__name__].Flagged = Flagged  # importable by its class path for jsonargparse
    Flagged.__module__ = __name__
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Flagged(), datamodule=BoringDataModule())
    checkpoint = tmp_path / "flagged.ckpt"
    trainer.save_checkpoint(checkpoint)
    cli = LightningCLI(Flagged, BoringDataModule, run=False, save_config_callback=None,
                       args=["--model.flag", "true", "--trainer.logger", "false"])
    assert cli.model.hparams.flag is True
    cli = LightningCLI(Flagged, BoringDataModule, save_config_callback=None, args=[
        "test", "--model.flag", "true", "--ckpt_path", str(checkpoint), "--trainer.logger",
        "false", "--trainer.enable_progress_bar", "false"])
    assert cli.model.hparams.flag is False


def test_lightningclis_config_without_a_logger_goes_to_the_working_folder(tmp_path, monkeypatch):
    """Lightning-AI/pytorch-lightning#17168: SaveConfigCallback writes config.yaml to
    trainer.log_dir, the working folder without a logger (and every MLflow or W&B run's shared
    save_dir), and refuses the second run there; runs.SaveConfig writes it in the run's folder."""
    monkeypatch.chdir(tmp_path)
    LightningCLI(BoringModel, BoringDataModule, args=[
        "fit", "--trainer.logger", "false", "--trainer.max_steps", "1",
        "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false"])
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["trainer"]["max_steps"] == 1
    with pytest.raises(RuntimeError, match="to NOT exist"):
        LightningCLI(BoringModel, BoringDataModule, args=[
            "fit", "--trainer.logger", "false", "--trainer.max_steps", "1",
            "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false"])


def test_lightning_restores_the_optimizer_of_a_checkpoint_over_a_new_learning_rate(tmp_path):
    """Lightning-AI/pytorch-lightning#12118: a fit resumed with another learning rate runs the
    checkpoint's (Lightning loads the saved optimizer state after configure_optimizers);
    lit_models/resume.py runs the one given."""

    class Rated(BoringModel):
        def __init__(self, lr: float):
            super().__init__()
            self.lr = lr

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    def fit(lr: float, steps: int, ckpt_path=None) -> L.Trainer:
        trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=tmp_path)
        trainer.fit(Rated(lr), datamodule=BoringDataModule(), ckpt_path=ckpt_path)
        return trainer

    fit(0.1, 2).save_checkpoint(tmp_path / "rated.ckpt")
    resumed = fit(0.001, 3, ckpt_path=tmp_path / "rated.ckpt")
    assert resumed.optimizers[0].param_groups[0]["lr"] == 0.1


def test_lightningclis_predict_writes_no_predictions(tmp_path, monkeypatch):
    """Lightning-AI/pytorch-lightning#10509: LightningCLI's predict subcommand hands what
    Trainer.predict returns to nobody; train.py's Trainer writes it (a BasePredictionWriter)."""
    monkeypatch.chdir(tmp_path)
    LightningCLI(BoringModel, BoringDataModule, save_config_callback=None, args=[
        "predict", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])
    assert not list(tmp_path.iterdir())


def test_sqlite_has_no_row_lock_for_optunas_take_of_a_waiting_trial():
    """optuna/optuna#4002: RDBStorage takes a waiting trial under `SELECT ... FOR UPDATE`, which
    SQLite has not (SQLAlchemy leaves it out), so two workers took one trial; lit_sweep's Storage
    takes it under a file lock there."""
    import inspect

    from optuna.storages import RDBStorage
    from sqlalchemy import column, select, table
    from sqlalchemy.dialects import postgresql, sqlite

    assert "for_update=True" in inspect.getsource(RDBStorage.set_trial_state_values)
    query = select(column("trial_id")).select_from(table("trials")).with_for_update()
    assert "FOR UPDATE" not in str(query.compile(dialect=sqlite.dialect()))
    assert "FOR UPDATE" in str(query.compile(dialect=postgresql.dialect()))
