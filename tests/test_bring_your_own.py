"""What a researcher brings and tries next (issue 35): torchvision's networks and classes of their
own, modules outside the project, a logger's run folder twice, Lightning's LR finder, strict=False,
and trainer calls in any order from Python."""

import sys
import textwrap
from functools import partial

import lightning as L
import pytest
import torch
import yaml
from conftest import results, run_train, runs
from lightning.pytorch.core.saving import load_hparams_from_yaml

import train
from datamodules import CIFAR10DataModule, MNISTDataModule
from lit_models import ImageClassifier

QUIET = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
SHORT = ["--trainer.max_epochs", "1", "--data.batch_size", "32"]


@pytest.mark.parametrize("builder", ["resnet18", "mobilenet_v3_small", "efficientnet_b0"])
def test_torchvisions_builders_train_from_python_with_no_weights(builder, cifar10_dir):
    model = ImageClassifier(f"torchvision.models.{builder}",
                            optimizer=partial(torch.optim.AdamW, lr=0.01))
    trainer = L.Trainer(max_steps=2, limit_val_batches=1, enable_checkpointing=False, **QUIET)
    trainer.fit(model, datamodule=CIFAR10DataModule(str(cifar10_dir), batch_size=16))
    assert trainer.global_step == 2 and model.hparams.net["class_path"].endswith(builder)
    images = torch.zeros(3, 3, 32, 32, dtype=torch.uint8)
    assert model.classify(images).shape == (3, 10)  # the data's ten classes, not ImageNet's 1000


def test_a_torchvision_network_trains_tests_and_loads_from_the_command_line(cifar10_dir, in_tmp):
    net = ["--model.net", "torchvision.models.resnet18"]
    assert run_train(["--model", "cnn", *net, "--data.data_dir", str(cifar10_dir), *SHORT,
                      "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
                      "--trainer.limit_test_batches", "1"]) == 0
    (run,) = runs(in_tmp)
    assert results(run)["network"] == "ResNet" and results(run)["tested"].endswith(".ckpt")
    model = ImageClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert type(model.net).__name__ == "ResNet" and model.net.fc.out_features == 10


def test_a_network_that_cannot_take_the_images_is_refused_before_anything_trains(
        mnist_dir, in_tmp, capsys):
    args = ["--model", "mlp", "--model.net", "torchvision.models.resnet18"]
    assert run_train([*args, "--data.data_dir", str(mnist_dir)]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("train.py: error: the network resnet18 cannot take (1, 28, 28) images")
    assert not (in_tmp / "lightning_logs").exists()


OWN_NETWORK = '''
from torch import nn


class Net(nn.Sequential):
    """A network that takes its classes, not the image shape, and a setting of its own."""

    def __init__(self, num_classes: int = 10, width: int = 8):
        layers = [nn.LazyLinear(width), nn.ReLU(), nn.Linear(width, num_classes)]
        super().__init__(nn.Flatten(), *layers)
'''


def test_a_class_taking_num_classes_alone_trains_with_its_settings_and_loads(mnist_dir,
                                                                             own_modules,
                                                                             monkeypatch, capsys):
    """Trained, then loaded from what the checkpoint holds (its class imported again)."""
    (own_modules / "own.py").write_text(textwrap.dedent(OWN_NETWORK))
    args = ["--model", "mlp", "--model.net", "own.Net", "--model.net.width", "16"]
    monkeypatch.chdir(own_modules)
    code = run_train([*args, "--data.data_dir", str(mnist_dir), *SHORT])
    assert code == 0, capsys.readouterr().err[-2000:]
    (run,) = runs(own_modules)
    del sys.modules["own"]  # imported again, from what the checkpoint names
    model = ImageClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert type(model.net).__name__ == "Net" and model.net[3].in_features == 16
    assert model.net[3].out_features == 10 and model.net[3].weight.shape == (10, 16)


def test_a_module_python_cannot_find_is_one_line(in_tmp, capsys):
    net = {"class_path": "my_nets.Wide"}
    (in_tmp / "my.yaml").write_text(yaml.safe_dump({
        "model": {"class_path": "lit_models.ImageClassifier", "init_args": {"net": net}}}))
    assert run_train(["--config", "my.yaml"]) == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith("train.py: error: ") and "No module named 'my_nets'" in line
    assert sorted(p.name for p in in_tmp.iterdir()) == ["my.yaml"]


@pytest.mark.parametrize("content", [bytes(range(256)), b"\xff\xfe\x00t\x00r\x00"])
def test_a_config_that_is_not_text_is_one_line(content, in_tmp, capsys):
    (in_tmp / "binary.yaml").write_bytes(content)
    for command in ([], ["--model", "mlp"], ["test", "--ckpt_path", "x.ckpt"]):
        assert run_train([*command, "--config", "binary.yaml"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("train.py: error: ") and "Traceback" not in line


def each_in_its_own_folder(root, runs_expected: int = 2) -> None:
    """Each run's record beside its checkpoints and its own configuration, in a folder of its own
    below `root`."""
    records = sorted(root.glob("**/results.json"))
    folders = {r.parent for r in records}
    assert len(records) == len(folders) == runs_expected
    for folder in folders:
        assert (folder / "config.yaml").is_file()
        assert (folder / "checkpoints" / "last.ckpt").is_file()
        assert results(folder)["log_dir"] == str(folder)
        assert results(folder)["metrics"]["test/acc"] > 0.2  # two steps: above chance (0.1)


LOGGED = ["--model", "mlp", *SHORT, "--trainer.limit_train_batches", "2",
          "--trainer.limit_test_batches", "1"]


def test_two_mlflow_runs_each_keep_their_files_in_their_own_folder(mnist_dir, in_tmp,
                                                                  monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 refuses file stores without
    mlflow = ["--trainer.logger", "MLFlowLogger", "--trainer.logger.tracking_uri", "file:./mlr"]
    for _ in range(2):
        assert run_train([*LOGGED, "--data.data_dir", str(mnist_dir), *mlflow]) == 0
    each_in_its_own_folder(in_tmp / "mlr")


def test_two_wandb_runs_each_keep_their_files_in_their_own_folder(mnist_dir, in_tmp, monkeypatch):
    """Weights & Biases goes on with the run a process has begun: wandb.finish() between the two,
    as a new process would begin its own."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = ["--trainer.logger", "WandbLogger", "--trainer.logger.offline", "true",
              "--trainer.logger.save_dir", "wb"]
    try:
        for _ in range(2):
            assert run_train([*LOGGED, "--data.data_dir", str(mnist_dir), *logger]) == 0
            wandb.finish()
    finally:
        wandb.finish()
    each_in_its_own_folder(in_tmp / "wb")


def test_a_run_into_a_run_folder_that_is_taken_is_one_line(mnist_dir, in_tmp, capsys):
    logger = ["--trainer.logger", "TensorBoardLogger", "--trainer.logger.save_dir", "tb",
              "--trainer.logger.name", "x", "--trainer.logger.version", "3"]
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT, *logger]
    assert run_train(args) == 0
    run = in_tmp / "tb" / "x" / "version_3"
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    record = (run / "results.json").read_text()
    code = run_train(args)
    assert (run / "results.json").read_text() == record
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert code == 2 and line.startswith("train.py: error: ") and "config.yaml" in line
    assert "Traceback" not in capsys.readouterr().err


def test_the_learning_rate_finders_rate_is_what_runs_and_what_is_recorded(mnist_dir, in_tmp):
    """config.yaml records the command (the recipe's rate); hparams.yaml and the checkpoint the
    rate found, which the optimizer and its OneCycle run at."""
    finder = ["--trainer.callbacks+=LearningRateFinder",
              "--trainer.callbacks.num_training_steps=40"]
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), "--data.batch_size", "24"]
    assert run_train([*args, "--trainer.max_epochs", "2", *finder]) == 0
    (run,) = runs(in_tmp)
    found = load_hparams_from_yaml(str(run / "hparams.yaml"))["optimizer"]["init_args"]["lr"]
    assert found != 0.015  # the recipe's
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.015
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["optimizer"]["init_args"]["lr"] == found
    assert checkpoint["optimizer_states"][0]["param_groups"][0]["max_lr"] == found  # OneCycle's


class Plain(L.LightningModule):
    """A plain LightningModule with a network and a buffer, as Lightning's docs write one."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(1))


def test_strict_false_loads_a_checkpoint_missing_a_key_as_lightning_does(tmp_path):
    model = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.2], std=[0.3])
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                  "pytorch-lightning_version": L.__version__}
    del checkpoint["state_dict"]["std"]
    torch.save(checkpoint, tmp_path / "partial.ckpt")
    plain = {
        "state_dict": {"layer.weight": torch.zeros(2, 4), "layer.bias": torch.zeros(2)},
        "pytorch-lightning_version": L.__version__,
        "hyper_parameters": {},
    }
    torch.save(plain, tmp_path / "plain.ckpt")
    for cls, path in ((ImageClassifier, "partial.ckpt"), (Plain, "plain.ckpt")):
        with pytest.raises(RuntimeError):  # Lightning's strict load (ModelError is one)
            cls.load_from_checkpoint(tmp_path / path)
        assert isinstance(cls.load_from_checkpoint(tmp_path / path, strict=False), cls)
    loaded = ImageClassifier.load_from_checkpoint(tmp_path / "partial.ckpt", strict=False)
    assert torch.equal(loaded.mean, checkpoint["state_dict"]["mean"])


def test_trainer_calls_in_any_order_from_python(mnist_dir, tmp_path):
    """validate, then fit (Lightning validates in inference mode); fit, test, then go on; a test of
    a compiled model."""
    data = MNISTDataModule(str(mnist_dir), batch_size=64)
    model = ImageClassifier("mlp")
    trainer = L.Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET)
    trainer.validate(model, datamodule=data)
    trainer.fit(model, datamodule=data)
    tested = trainer.test(model, datamodule=data, verbose=False)[0]["test/acc"]
    again = L.Trainer(max_epochs=2, default_root_dir=tmp_path, **QUIET)
    again.fit(model, datamodule=data, ckpt_path=trainer.checkpoint_callback.best_model_path)
    assert again.current_epoch == 2 and tested > 0.5
    # Dynamo's wrapper is what a test of it meets; inductor's C++ (seconds) is not needed here.
    compiled = torch.compile(model, backend="eager")
    compiled = again.test(compiled, datamodule=data, verbose=False)[0]["test/acc"]
    assert compiled == again.test(model, datamodule=data, verbose=False)[0]["test/acc"]


def test_the_command_line_builds_a_torchvision_network_for_the_data(tmp_path):
    cli = train.TrainCLI(["--model.net", "torchvision.models.resnet18", "--trainer.logger",
                          "false", "--data.data_dir", str(tmp_path)], run=False)
    assert type(cli.model.net).__name__ == "ResNet" and cli.model.net.fc.out_features == 10
