"""`python train.py` as a user runs it: what a run writes, recipes and short names, configs that
replay, extending."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from conftest import ROOT, results, run_in_terminal, run_train, runs, scalars

import datamodules
from lit_cli import command_line
from lit_models import NETWORKS


def test_a_run_fits_tests_and_writes_its_directory(trained):
    run = trained.run
    record = results(run)
    assert record["stage"] == "fit" and record["network"] == "mlp" and record["data"] == "mnist"
    assert record["model"] == "ImageClassifier" and record["test"] == "tested"
    assert record["test/acc"] > 0.9 and record["val/acc_best"] > 0.9 and record["epochs"] == 3
    assert record["global_step"] == 3 * (540 // 64) and len(record["train_epoch_seconds"]) == 3
    assert set(record["test/acc_per_class"]) == set(datamodules.MNISTDataModule.classes)
    best = run / "checkpoints" / f"epoch{record['checkpoint'].split('epoch')[1]}"
    assert (
        best.is_file()
        and (run / "checkpoints" / "last.ckpt").is_file()
        and record["checkpoint"] == str(best)
    )
    logged = scalars(run)
    assert len(logged["train/loss_epoch"]) == len(logged["val/acc"]) == 3
    assert logged["test/acc"][0] == record["test/acc"]
    assert logged["hp_metric"][-1] == pytest.approx(record["val/acc_best"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    last_written = max(
        events.Scalars("hp_metric"), key=lambda e: e.wall_time
    )  # what the HParams tab shows
    assert last_written.value == pytest.approx(record["val/acc_best"])
    assert max(logged["val/acc"]) == pytest.approx(record["val/acc_best"])
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["net"]["class_path"] == "lit_models.TutorialMLP"
    assert config["trainer"]["max_epochs"] == 3


@pytest.mark.slow
def test_the_saved_config_runs_the_same_model_again(trained, monkeypatch):
    monkeypatch.chdir(trained.cwd)
    assert run_train(["--config", str(trained.run / "config.yaml")]) == 0
    again = max(runs(trained.cwd), key=lambda r: r.stat().st_mtime)
    assert results(again)["test/acc"] == results(trained.run)["test/acc"]
    assert results(again)["val/acc_best"] == results(trained.run)["val/acc_best"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, data, first_layer",
    [
        ("cnn", "cifar10", 400),
        ("mlp", "cifar10", 3072),
        ("cnn", "mnist", 256),
        ("mlp", "mnist", 784),
    ],
)
def test_any_model_runs_on_any_data(
    model, data, first_layer, mnist_dir, cifar10_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                model,
                "--data",
                data,
                "--data.data_dir",
                str(mnist_dir),
                "--data.batch_size",
                "32",
                "--trainer.max_epochs",
                "1",
            ]
        )
        == 0
    )
    checkpoint = torch.load(runs(tmp_path)[0] / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["state_dict"]["net.fc1.weight"].shape[1] == first_layer


def test_overrides_and_recipes(mnist_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_train(["--model", "mlp", "--data.data_dir", str(mnist_dir), "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (
        printed["model"]["init_args"]["lr"] == 0.015
        and printed["data"]["init_args"]["batch_size"] == 1536
    )
    assert (
        run_train(
            [
                "--model",
                "mlp",
                "--data.data_dir",
                str(mnist_dir),
                "--model.lr",
                "0.003",
                "--model.optimizer",
                "SGD",
                "--model.scheduler",
                "null",
                "--data.batch_size",
                "50",
                "--trainer.max_epochs",
                "1",
                "--print_config",
            ]
        )
        == 0
    )
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["init_args"]["optimizer"]["class_path"] == "torch.optim.SGD"
    assert (
        printed["model"]["init_args"]["scheduler"] is None
        and printed["model"]["init_args"]["lr"] == 0.003
    )
    assert (
        run_train(["--data.data_dir", str(mnist_dir), "--print_config"]) == 0
    )  # no recipe: the CNN's
    net = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["net"]
    assert net["class_path"] == "lit_models.TutorialCNN"


@pytest.mark.parametrize(
    "config, batch, epochs, optimizer, lr, mean",
    [
        ("tutorial_cnn", 4, 2, "SGD", 0.001, [0.5, 0.5, 0.5]),
        ("tutorial_mlp", 64, 10, "Adam", 0.001, [0.5]),
    ],
)
def test_tutorial_configs_hold_the_tutorials_settings(
    config, batch, epochs, optimizer, lr, mean, capsys
):
    assert run_train(["--model", config, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    model, data = printed["model"]["init_args"], printed["data"]["init_args"]
    assert (data["batch_size"], printed["trainer"]["max_epochs"]) == (batch, epochs)
    assert (model["lr"], model["mean"]) == (lr, mean)
    assert model["optimizer"]["class_path"].endswith(optimizer) and model["scheduler"] is None
    assert data["val_size"] == 0 and model["label_smoothing"] == 0


def test_a_run_without_validation_trains_on_everything_and_tests_the_last_weights(
    mnist_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                "tutorial_mlp",
                "--data.data_dir",
                str(mnist_dir),
                "--trainer.max_epochs",
                "2",
            ]
        )
        == 0
    )
    record = results(runs(tmp_path)[0])
    assert record["global_step"] == 2 * (600 // 64) and record["val/acc_best"] is None
    assert record["checkpoint"].endswith("last.ckpt")
    assert record["test/acc"] > 0.5
    assert (
        run_train(["test", "--ckpt_path", "best"]) == 0
    )  # its last weights (no val/acc_best: -inf)


@pytest.mark.parametrize(
    "flag, value, names",
    [
        ("--model", "no_such_recipe", command_line.recipes()),
        ("--data", "no_such_data", list(datamodules.DATA)),
    ],
)
def test_unknown_names_exit_2_and_list_what_is_registered(flag, value, names, capsys):
    assert run_train([flag, value]) == 2
    error = capsys.readouterr().err
    assert f"unknown {flag} '{value}'" in error and all(name in error for name in names)


def test_help_and_usage_name_what_is_registered(capsys):
    assert run_train(["--help"]) == 0
    out = capsys.readouterr().out
    usage = out.split("\n\n")[0]
    assert all(
        name in usage
        for name in [*command_line.recipes(), *datamodules.DATA, *command_line.SUBCOMMANDS]
    )
    assert all(name in out for name in ("--trainer.max_epochs", "--seed_everything", "--ckpt_path"))
    assert run_train(["--model.help", "ImageClassifier"], quiet=False) == 0
    net = " ".join(capsys.readouterr().out.split("--model.net NET")[-1].split())
    assert "lit_models.networks.NETWORKS" in net and "import path" in net
    assert (
        run_train(["--model.net.help", "TutorialCNN"], quiet=False) == 0
    )  # the network's own settings
    widths = capsys.readouterr().out
    assert all(f"--net.{name}" in widths for name in ("channels", "hidden")) and "[6, 16]" in widths


@pytest.mark.slow
def test_same_seed_same_numbers_and_a_random_seed_is_recorded(mnist_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(
        "PL_GLOBAL_SEED", raising=False
    )  # where Lightning's seed_everything(None) would look first
    args = [
        "--model",
        "cnn",
        "--data",
        "mnist",
        "--data.data_dir",
        str(mnist_dir),
        "--data.batch_size",
        "32",
        "--trainer.max_epochs",
        "1",
    ]
    for extra in ([], [], ["--seed_everything", "1"], ["--seed_everything", "true"]):
        assert run_train(args + extra) == 0
    first, same, other, chosen = (results(r) for r in runs(tmp_path))
    assert first["test/loss"] == same["test/loss"] != other["test/loss"]
    assert isinstance(chosen["seed"], int) and chosen["seed"] not in (0, 1)
    assert run_train(args + ["--seed_everything", str(chosen["seed"])]) == 0
    assert results(runs(tmp_path)[-1])["test/loss"] == chosen["test/loss"]


@pytest.mark.slow
def test_compile_trains_the_same_network(mnist_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [
        "--model",
        "mlp",
        "--data.data_dir",
        str(mnist_dir),
        "--data.batch_size",
        "64",
        "--trainer.max_epochs",
        "1",
    ]
    assert run_train(args) == 0
    assert run_train(args + ["--model.compile", "true"]) == 0
    plain, compiled = (results(r) for r in runs(tmp_path))
    assert compiled["test/acc"] == pytest.approx(plain["test/acc"], abs=0.02)


@pytest.mark.slow
def test_the_default_progress_bar_in_a_terminal(mnist_dir, tmp_path):
    code, output = run_in_terminal(
        [
            "--model",
            "mlp",
            "--data.data_dir",
            str(mnist_dir),
            "--data.batch_size",
            "64",
            "--trainer.max_epochs",
            "2",
        ],
        cwd=tmp_path,
    )
    assert code == 0, output[-2000:]
    assert "Epoch 1" in output and "val/acc" in output
    assert "ImageClassifier(mlp) on mnist: test/acc" in output
    assert "Traceback" not in output and "Warning" not in output.replace("PossibleUserWarning", "")


# --- extending: a network and a data set of one's own, from their own module
# ------------------------------------

EXTENSION = '''
import torch
from torch import nn

from datamodules import ImageDataModule


class TinyNet(nn.Sequential):
    """A network of one's own: any nn.Module taking (image_shape, num_classes), then its own
    settings."""

    def __init__(self, image_shape, num_classes, hidden: int = 4):
        c, h, w = image_shape
        layers = [nn.Linear(c * h * w, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)]
        super().__init__(nn.Flatten(), *layers)


class Stripes(ImageDataModule):
    """A data set of one's own: a name, its classes and image shape, and how to read a split."""

    name = "stripes"
    classes = ["horizontal", "vertical"]
    image_shape = (1, 8, 8)

    def read(self, split):
        generator = torch.Generator().manual_seed(int(split == "test"))
        labels = torch.randint(0, 2, (400,), generator=generator)
        images = torch.zeros(400, 1, 8, 8, dtype=torch.uint8)
        images[labels == 0, :, ::2, :] = 255
        images[labels == 1, :, :, ::2] = 255
        return images, labels
'''


@pytest.mark.slow
def test_a_network_and_a_data_set_of_ones_own_train_from_the_command_line(own_modules,
                                                                         monkeypatch, capsys):
    tmp_path = own_modules
    (tmp_path / "mine.py").write_text(textwrap.dedent(EXTENSION))
    (tmp_path / "tiny.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {
                    "class_path": "lit_models.ImageClassifier",
                    "init_args": {
                        "net": {"class_path": "mine.TinyNet", "init_args": {"hidden": 16}},
                        "lr": 0.05,
                    },
                },
                "data": {"class_path": "mine.Stripes", "init_args": {"batch_size": 32}},
                "trainer": {"max_epochs": 2},
            }
        )
    )
    monkeypatch.chdir(tmp_path)
    code = run_train(["--config", "tiny.yaml"])
    assert code == 0, capsys.readouterr().err[-2000:]
    record = results(runs(tmp_path)[0])
    assert (
        record["test/acc"] == 1.0 and record["data"] == "stripes" and record["network"] == "TinyNet"
    )
    assert set(record["test/acc_per_class"]) == {"horizontal", "vertical"}
    capsys.readouterr()
    code = run_train(["test", "--ckpt_path", "best"])
    assert code == 0 and "test/acc 1.0000" in capsys.readouterr().out


@pytest.mark.parametrize("recipe", command_line.recipes())
def test_every_recipe_runs_the_network_data_and_length_it_writes(recipe, capsys):
    written = yaml.safe_load((command_line.RECIPES / f"{recipe}.yaml").read_text())
    assert run_train(["--model", recipe, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    net = printed["model"]["init_args"]["net"]["class_path"]
    assert net == written["model"]["init_args"]["net"]["class_path"]
    assert printed["data"]["class_path"] == written["data"]["class_path"]
    assert printed["trainer"]["max_epochs"] == written["trainer"]["max_epochs"]
    for key, value in written["data"].get("init_args", {}).items():
        assert printed["data"]["init_args"][key] == value, key


def test_the_registries_hold_the_built_in_names():  # and more once a user adds some
    assert {"cnn", "mlp"} <= set(NETWORKS)
    assert {"cifar10", "mnist", "fashion_mnist", "image_folder"} <= set(datamodules.DATA)
    assert {"cnn", "mlp", "tutorial_cnn", "tutorial_mlp"} <= set(command_line.recipes())
    assert "\n" not in command_line.usage()


QUICK = [("quick_cnn", "cnn", 1), ("quick_mlp", "mlp", 4), ("quick_cnn_gpu", "cnn", 4),
         ("quick_mlp_gpu", "mlp", 8)]


@pytest.mark.parametrize("recipe, arch, epochs", QUICK)
def test_quick_recipes_train_on_every_image_and_test_the_last_weights(recipe, arch, epochs, capsys):
    assert run_train(["--model", recipe, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (
        printed["data"]["init_args"]["val_size"] == 0 and printed["trainer"]["max_epochs"] == epochs
    )
    assert (
        printed["model"]["init_args"]["net"]["class_path"] == f"lit_models.Tutorial{arch.upper()}"
    )
    assert not any("ModelCheckpoint" in c["class_path"] for c in printed["trainer"]["callbacks"])


def test_flip_test_averages_an_image_and_its_mirror(trained):
    from lit_models import ImageClassifier

    model = ImageClassifier.load_from_checkpoint(trained.run / "checkpoints" / "last.ckpt").eval()
    images = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    plain = model(images)
    model.hparams.flip_test = True
    mirrored = model.net((images.flip(3).float() / 255 - model.mean) / model.std)
    assert torch.allclose(model(images), (plain + mirrored) / 2, atol=1e-5)
    model.train()
    assert torch.allclose(model(images), plain, atol=1e-6)  # training sees each image once


def test_ema_from_the_command_line_averages_every_step(trained, monkeypatch):
    monkeypatch.chdir(trained.cwd)
    assert (
        run_train(
            [
                "--config",
                str(trained.run / "config.yaml"),
                "--trainer.callbacks+=EMA",
                "--trainer.callbacks.decay=0.9",
            ]
        )
        == 0
    )
    run = max(runs(trained.cwd), key=lambda r: r.stat().st_mtime)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(checkpoint["averaging_state"]["n_averaged"]) == checkpoint["global_step"] == 24
    averaged, current = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert not torch.equal(averaged["net.fc1.weight"], current["net.fc1.weight"])


@pytest.mark.slow
def test_an_installed_copy_finds_its_recipes_and_has_its_commands(tmp_path):
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    for name, module in (("lit-train", "train"), ("lit-sweep", "sweep")):
        script = (target / "bin" / name).read_text()
        assert f"from lit_image_classifiers.{module} import command" in script
    code = (
        "import sys, lit_image_classifiers.train as t; print(t.__file__); "
        "sys.argv[1:] = ['--model', 'quick_mlp', '--print_config']; t.command()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(str(target)) and "quick" not in proc.stdout.split("\n", 1)[0]
    assert yaml.safe_load(proc.stdout.split("\n", 1)[1])["data"]["init_args"]["val_size"] == 0
