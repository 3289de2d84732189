"""What a researcher brings and tries next (issue 35): torchvision's networks and classes of their
own, modules outside the project, a logger's run folder twice, Lightning's LR finder, strict=False,
and trainer calls in any order from Python."""

import subprocess
import sys
import textwrap

import lightning as L
import pytest
import torch
import yaml
from conftest import ROOT, results, run_process, run_train, runs

import train
from datamodules import CIFAR10DataModule, MNISTDataModule
from lit_models import ImageClassifier

QUIET = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
SHORT = ["--trainer.max_epochs", "1", "--data.batch_size", "32"]


@pytest.mark.parametrize("builder", ["resnet18", "mobilenet_v3_small", "efficientnet_b0"])
def test_torchvisions_builders_train_from_python_with_no_weights(builder, cifar10_dir):
    model = ImageClassifier(f"torchvision.models.{builder}", lr=0.01)
    trainer = L.Trainer(max_steps=2, limit_val_batches=1, enable_checkpointing=False, **QUIET)
    trainer.fit(model, datamodule=CIFAR10DataModule(str(cifar10_dir), batch_size=16))
    assert trainer.global_step == 2 and model.hparams.net["class_path"].endswith(builder)
    images = torch.zeros(3, 3, 32, 32, dtype=torch.uint8)
    assert model.classify(images).shape == (3, 10)  # the data's ten classes, not ImageNet's 1000


@pytest.mark.slow
def test_a_torchvision_network_trains_tests_and_loads_from_the_command_line(cifar10_dir, in_tmp):
    net = ["--model.net", "torchvision.models.resnet18"]
    assert run_train(["--model", "cnn", *net, "--data.data_dir", str(cifar10_dir), *SHORT]) == 0
    (run,) = runs(in_tmp)
    assert results(run)["network"] == "ResNet"
    assert run_train(["test", "--ckpt_path", "best"]) == 0
    model = ImageClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert type(model.net).__name__ == "ResNet" and model.net.fc.out_features == 10


def test_a_network_that_cannot_take_the_images_is_refused_before_anything_trains(
    mnist_dir, in_tmp, capsys
):
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


@pytest.mark.slow
def test_a_class_taking_num_classes_alone_trains_with_its_settings_and_loads(mnist_dir,
                                                                             own_modules,
                                                                             monkeypatch, capsys):
    """Trained in this process, loaded in a fresh one: from what the checkpoint holds."""
    tmp_path = own_modules
    (tmp_path / "own.py").write_text(textwrap.dedent(OWN_NETWORK))
    args = ["--model", "mlp", "--model.net", "own.Net", "--model.net.width", "16"]
    monkeypatch.chdir(tmp_path)
    code = run_train([*args, "--data.data_dir", str(mnist_dir), *SHORT])
    assert code == 0, capsys.readouterr().err[-2000:]
    (run,) = runs(tmp_path)
    load = (
        "import sys; from lit_models import ImageClassifier; "
        f"m = ImageClassifier.load_from_checkpoint('{run}/checkpoints/last.ckpt'); "
        "print(type(m.net).__name__, m.net[3].in_features, m.net[3].out_features)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", load],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{ROOT}:{tmp_path}"},
        cwd=tmp_path,
    )
    assert loaded.stdout.split() == ["Net", "16", "10"], loaded.stderr[-2000:]


def test_a_module_python_cannot_find_is_one_line_that_says_how_it_is_found(tmp_path):
    (tmp_path / "my.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {
                    "class_path": "lit_models.ImageClassifier",
                    "init_args": {"net": {"class_path": "my_nets.Wide"}},
                }
            }
        )
    )
    proc = run_process(["--config", "my.yaml"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "train.py: error: no module named 'my_nets': a module of your own is found on the "
        "PYTHONPATH (PYTHONPATH=. python train.py ..., where my_nets.py lies in .), and an "
        "installed package's class by its import path"
    ]


@pytest.mark.parametrize("content", [bytes(range(256)), b"\xff\xfe\x00t\x00r\x00"])
def test_a_config_that_is_not_text_is_one_line(content, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "binary.yaml").write_bytes(content)
    for command in ([], ["test", "--ckpt_path", "x.ckpt"]):
        assert run_train([*command, "--config", "binary.yaml"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith("train.py: error: --config binary.yaml: not a YAML or JSON text file")
        )


def test_short_names_print_their_classes_options(capsys):
    assert run_train(["--data.help", "cifar10"], quiet=False) == 0
    assert "--data.crop_padding" in capsys.readouterr().out
    assert run_train(["--model.net.help", "mlp"], quiet=False) == 0
    assert "--net.hidden" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    "logger",
    [
        ["--trainer.logger", "MLFlowLogger", "--trainer.logger.tracking_uri", "file:./mlr"],
        [
            "--trainer.logger",
            "WandbLogger",
            "--trainer.logger.offline",
            "true",
            "--trainer.logger.save_dir",
            "wb",
        ],
    ],
)
def test_two_runs_of_one_logger_each_keep_their_files_in_their_own_folder(
    logger, mnist_dir, tmp_path
):
    """Two processes (Weights & Biases goes on with the run a process has begun)."""
    env = {"MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT, *logger]
    for _ in range(2):
        proc = run_process(args, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
    records = sorted(tmp_path.glob("**/results.json"))
    folders = {r.parent for r in records}
    assert len(records) == 2 and len(folders) == 2
    for folder in folders:  # beside the run's checkpoints, with its own configuration
        assert (folder / "config.yaml").is_file()
        assert (folder / "checkpoints" / "last.ckpt").is_file()
        assert results(folder)["log_dir"] == str(folder)


def test_a_run_into_a_run_folder_that_is_taken_is_one_line(mnist_dir, in_tmp, capsys):
    logger = [
        "--trainer.logger",
        "TensorBoardLogger",
        "--trainer.logger.save_dir",
        "tb",
        "--trainer.logger.name",
        "x",
        "--trainer.logger.version",
        "3",
    ]
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT, *logger]
    assert run_train(args) == 0
    before = (in_tmp / "tb/x/version_3/results.json").read_text()
    assert run_train(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "train.py: error: tb/x/version_3/config.yaml exists: the logger's run folder holds another "
        "run; give the logger a version of its own (--trainer.logger.version ...), or leave it to "
        "pick one"
    )
    assert (in_tmp / "tb/x/version_3/results.json").read_text() == before


def test_the_learning_rate_finders_rate_is_what_runs_and_what_is_recorded(mnist_dir, in_tmp):
    finder = [
        "--trainer.callbacks+=LearningRateFinder",
        "--trainer.callbacks.num_training_steps=40",
    ]
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), "--data.batch_size", "24"]
    assert run_train([*args, "--trainer.max_epochs", "2", *finder]) == 0
    (run,) = runs(in_tmp)
    found = yaml.safe_load((run / "hparams.yaml").read_text())["lr"]
    assert found != 0.015  # the recipe's
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]["lr"] == found
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["lr"] == found
    assert checkpoint["optimizer_states"][0]["param_groups"][0]["max_lr"] == found  # OneCycle's


class Plain(L.LightningModule):
    """A plain LightningModule with a network and a buffer, as Lightning's docs write one."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(1))


def test_strict_false_loads_a_checkpoint_missing_a_key_as_lightning_does(trained, tmp_path):
    checkpoint = torch.load(trained.run / "checkpoints" / "last.ckpt", weights_only=True)
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


def test_use_distributed_sampler_false_is_refused_where_the_data_shards_itself(mnist_dir, capsys):
    args = [
        "--model",
        "mlp",
        "--data.data_dir",
        str(mnist_dir),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.logger",
        "false",
    ]
    assert run_train([*args, "--trainer.use_distributed_sampler", "false"]) == 2
    assert (
        "--trainer.use_distributed_sampler false: the data modules share"
        in (capsys.readouterr().err.strip().splitlines()[-1])
    )


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
    # Dynamo's wrapper is what a test of it meets; inductor's C++ (seconds) is test_cli's compile.
    compiled = torch.compile(model, backend="aot_eager")
    compiled = again.test(compiled, datamodule=data, verbose=False)[0]["test/acc"]
    assert compiled == again.test(model, datamodule=data, verbose=False)[0]["test/acc"]


def test_the_command_line_builds_a_torchvision_network_for_the_data(tmp_path):
    cli = train.TrainCLI(
        [
            "--model.net",
            "torchvision.models.resnet18",
            "--trainer.logger",
            "false",
            "--data.data_dir",
            str(tmp_path),
        ],
        run=False,
    )
    assert type(cli.model.net).__name__ == "ResNet" and cli.model.net.fc.out_features == 10


def test_tensorboards_first_view_names_the_run_and_has_no_placeholder(trained):
    """The Text tab says what a version_N run is; hp_metric holds the real values only (Lightning's
    default logger would log -1 first, which bends the smoothed curve)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained.run), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    (text,) = [t for t in events.Tags()["tensors"] if t.startswith("run")]
    said = events.Tensors(text)[0].tensor_proto.string_val[0].decode()
    assert said == ("ImageClassifier(mlp) on mnist: TutorialMLP, lr 0.015, AdamW, OneCycle, "
                    "batch 64, 3 epochs")
    values = [e.value for e in events.Scalars("hp_metric")]
    assert len(values) == 3 and -1 not in values
