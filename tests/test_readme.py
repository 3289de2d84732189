"""The README's commands and its From Python block, run as written on tiny data in the real formats.

Each `python train.py` / `python sweep.py` line of the README's bash blocks runs in order in one
folder, with the data folder and a short run appended (what follows overrides what precedes)."""

import re
import shlex
import shutil

import numpy as np
import pytest
import torch
from conftest import ROOT, run_train, sweep_here, write_cifar10, write_mnist
from PIL import Image

README = (ROOT / "README.md").read_text()
SHORT = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4",
         "--trainer.enable_progress_bar", "false"]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands() -> list[list[str]]:
    lines = [line.split("#")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines
            if line.startswith(("python train.py", "python sweep.py"))]


@pytest.fixture
def folder(tmp_path):
    """What the README's commands read: the data sets, image files and the recipes."""
    cwd = tmp_path
    write_cifar10(write_mnist(write_mnist(cwd / "data"), folder="FashionMNIST"))
    (cwd / "my_images").mkdir()
    for name in ("a.png", "b.jpg"):
        Image.fromarray(np.full((32, 32, 3), 200, dtype=np.uint8)).save(cwd / "my_images" / name)
    shutil.copy(cwd / "my_images" / "b.jpg", cwd / "photo.jpg")
    shutil.copytree(ROOT / "configs", cwd / "configs")
    return cwd


def script_commands(script: str) -> list[list[str]]:
    return [command[1:] for command in commands() if command[0] == script]


@pytest.mark.slow
def test_every_train_command_runs_as_written(folder, monkeypatch, capsys):
    """train.py lines, in order, in this process (train.main, as `python train.py` calls it: the
    same exit code and messages, without five seconds of imports each)."""
    assert len(commands()) >= 12 and script_commands("sweep.py")
    monkeypatch.chdir(folder)
    for args in script_commands("train.py"):
        if args[0] not in ("test", "validate", "predict", "export"):
            args += ["--data.data_dir", "data", *SHORT, "--data.batch_size", "32"]
        code, err = run_train(args, quiet=False), capsys.readouterr().err
        assert code == 0, f"train.py {shlex.join(args)}\n{err[-3000:]}"
    assert (folder / "model.onnx").is_file() and (folder / "predictions.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("args", script_commands("sweep.py"), ids=shlex.join)
def test_every_sweep_command_runs_as_written(args, folder, capfd):
    """sweep.py lines, each on its own beside the train.py lines, in this process (sweep.main, as
    `python sweep.py` calls it); their workers are processes, as ever."""
    args = [*args, "--trials", "2", "--seeds", "1", "--data.data_dir", "data", *SHORT,
            "--data.batch_size", "32"]
    code, err = sweep_here(args, folder, capfd)
    assert code == 0, f"sweep.py {shlex.join(args)}\n{err[-3000:]}"


@pytest.mark.slow
def test_the_from_python_block_runs_and_the_model_is_the_same_everywhere(tmp_path, monkeypatch):
    (code,) = [block for block in blocks("python") if "load_from_checkpoint" in block]
    write_mnist(tmp_path / "data", train=2000)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    model, data, trainer = namespace["model"], namespace["data"], namespace["trainer"]
    assert (tuple(model.hparams.image_shape) == (1, 28, 28)
            and model.hparams.mean == pytest.approx(data.mean))
    assert model.class_names == data.classes
    tested = trainer.test(namespace["model"], datamodule=data, verbose=False)[0]["test/acc"]
    images, labels = data.read("test")
    classified = (model.classify(images).argmax(1) == labels).float().mean().item()
    assert classified == pytest.approx(tested, abs=1e-6) and tested > 0.9
    net = torch.load("mlp.ckpt", weights_only=True)["hyper_parameters"]["net"]
    assert net == {"class_path": "lit_models.networks.TutorialMLP", "init_args": {}}
    assert (tmp_path / "mlp.onnx").is_file() and namespace["probabilities"].shape == (8, 10)
