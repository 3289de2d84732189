"""The README's commands and its From Python block, run as written on tiny data in the real formats,
and the set-up that makes them run.

Each `python train.py` / `python sweep.py` line of the README's bash blocks runs in order in one
folder, with the data folder and a short run appended (what follows overrides what precedes)."""

import re
import shlex
import shutil
import sys

import numpy as np
import pytest
import tomllib
import torch
from conftest import ROOT, results, run_train, runs, sweep_here, write_cifar10, write_mnist
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
    # Enough Fashion-MNIST images for the sweep space's batches of up to 1536.
    write_cifar10(write_mnist(write_mnist(cwd / "data"), folder="FashionMNIST", train=1800))
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
    record = results(runs(tmp_path)[0])  # RunRecord's, from Python as from train.py
    assert record["status"] == "finished" and record["metrics"]["val/acc"] > 0.9


def test_the_set_up_installs_what_the_readme_runs():
    """Issue 56's defect 9: after `./run train`, `python sweep.py` ended in "No module named
    'optuna'" and an ONNX export asked for one package at a time. ./run train and ./run sweep
    install the `all` extra: Optuna and the ONNX exporter and runtime."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert "lit-image-classifiers[sweep,export]" in extras["all"]
    wanted = {"optuna", "optuna-integration", "pandas", "onnx", "onnxscript", "onnxruntime"}
    named = {re.split("[<>=\\[]", requirement)[0] for name in ("sweep", "export")
             for requirement in extras[name]}
    assert wanted <= named
    assert re.search(r'train\|sweep\) extras="\[all\]"', (ROOT / "run").read_text())


@pytest.mark.parametrize("module, extra", [("onnx", "export"), ("optuna", "sweep")])
def test_a_missing_package_is_one_line_naming_the_install_command(module, extra, trained,
                                                                monkeypatch, capsys):
    """Where the packages are missing (an install without the extra), one line names the one
    command that installs them all."""
    monkeypatch.chdir(trained.cwd)
    monkeypatch.setitem(sys.modules, module, None)  # `import onnx` raises ModuleNotFoundError
    if module == "onnx":
        code = run_train(["export", "--ckpt_path", str(trained.run), "--format", "onnx",
                          "--output", "model.onnx"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and err[-1] == (
            f"train.py: error: this needs the package '{module}': pip install -e '.[{extra}]'")
        return
    import sweep

    for imported in ("lit_sweep", "lit_sweep.study"):  # imported by other tests: import again
        monkeypatch.delitem(sys.modules, imported, raising=False)
    assert sweep.main(["--model", "mlp"]) != 0
    assert f"pip install -e '.[{extra}]'" in capsys.readouterr().err
