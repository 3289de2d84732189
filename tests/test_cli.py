"""`python train.py` as a user runs it: what a run writes, recipes and class names, configs that
replay, extending. The command line is LightningCLI's, with three rules of train.py's (issue 56,
item 2): no subcommand is fit, `--model NAME` is the recipe configs/NAME.yaml, and `--ckpt_path`
names one file of one run."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, results, run_train, runs, scalars

from datamodules import MNISTDataModule
from lit_cli import command_line
from lit_models import NETWORKS

SHORT = ["--trainer.max_epochs", "1", "--data.batch_size", "32"]
FEW = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
       "--trainer.limit_test_batches", "1"]


def printed(args: list[str], capsys) -> dict:
    """The configuration `--print_config` prints for the command line `args`."""
    capsys.readouterr()
    assert run_train([*args, "--print_config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def newest(cwd: Path) -> Path:
    """The run folder under cwd/lightning_logs written last."""
    return max(runs(cwd), key=lambda r: r.stat().st_mtime)


def test_a_run_fits_tests_and_writes_its_directory(trained):
    """No subcommand: fit, then a test of the best checkpoint; the run folder holds its record,
    checkpoints, events and config."""
    run = trained.run
    record = results(run)
    metrics = record["metrics"]
    assert (record["model"], record["network"], record["data"]) == ("ImageClassifier", "mlp",
                                                                     "mnist")
    assert (record["stage"], record["status"], record["epochs"]) == ("fit", "finished", 3)
    assert metrics["test/acc"] > 0.9 and metrics["val/acc_best"] > 0.9
    assert record["global_step"] == 3 * (540 // 64) and record["log_dir"] == str(run)
    assert set(record["test/acc_per_class"]) == set(MNISTDataModule.classes)
    best = Path(record["best_model_path"])
    assert best.parent == run / "checkpoints" and best.name.startswith("epoch") and best.is_file()
    assert record["tested"] == str(best) and (run / "checkpoints" / "last.ckpt").is_file()
    logged = scalars(run)
    assert len(logged["train/loss_epoch"]) == len(logged["val/acc"]) == 3
    assert len(logged["train/epoch_seconds"]) == 3
    assert logged["test/acc"][0] == pytest.approx(metrics["test/acc"])
    assert max(logged["val/acc"]) == pytest.approx(metrics["val/acc_best"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    # What the HParams tab shows: the value of the latest step (Lightning's TensorBoardLogger logs
    # a -1 at step 0 as each stage starts).
    latest = max(events.Scalars("hp_metric"), key=lambda e: e.step)
    assert latest.step == record["global_step"] - 1
    assert latest.value == pytest.approx(metrics["val/acc_best"])
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["net"]["class_path"] == "lit_models.TutorialMLP"
    assert config["trainer"]["max_epochs"] == 3


def test_the_saved_config_runs_the_same_model_again(trained, monkeypatch):
    monkeypatch.chdir(trained.cwd)
    assert run_train(["--config", str(trained.run / "config.yaml")]) == 0
    again = newest(trained.cwd)
    assert again != trained.run
    before, after = results(trained.run)["metrics"], results(again)["metrics"]
    assert after["test/loss"] == before["test/loss"]
    assert after["val/acc_best"] == before["val/acc_best"]


# Each recipe on the other's data (on its own: `trained` here, CIFAR-10's CNN in
# test_lightning_native's partial config).
@pytest.mark.parametrize("model, data, first_layer", [
    ("mlp", "CIFAR10DataModule", 3072),
    ("cnn", "MNISTDataModule", 256),
])
def test_any_model_runs_on_any_data(model, data, first_layer, mnist_dir, cifar10_dir, in_tmp):
    args = ["--model", model, "--data", data, "--data.data_dir", str(mnist_dir), *SHORT, *FEW]
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["state_dict"]["net.fc1.weight"].shape[1] == first_layer
    assert results(run)["data"] == {"CIFAR10DataModule": "cifar10"}.get(data, "mnist")


def test_overrides_and_recipes(capsys):
    config = printed(["--model", "mlp"], capsys)
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.015
    assert config["data"]["init_args"]["batch_size"] == 1536
    config = printed(["--model", "mlp", "--model.optimizer", "SGD", "--model.optimizer.lr", "0.003",
                      "--model.scheduler", "null", "--data.batch_size", "50",
                      "--trainer.max_epochs", "1"], capsys)
    model = config["model"]["init_args"]
    assert model["optimizer"]["class_path"] == "torch.optim.SGD" and model["scheduler"] is None
    # SGD from its own defaults, but for the rate given after it: not AdamW's weight decay.
    assert model["optimizer"]["init_args"]["lr"] == 0.003
    assert model["optimizer"]["init_args"]["weight_decay"] == 0
    assert config["data"]["init_args"]["batch_size"] == 50 and config["trainer"]["max_epochs"] == 1
    # No recipe named: the CNN's.
    config = printed([], capsys)
    assert config["model"]["init_args"]["net"]["class_path"] == "lit_models.TutorialCNN"
    assert config["data"]["class_path"] == "datamodules.CIFAR10DataModule"


@pytest.mark.parametrize("config, batch, epochs, optimizer, lr, mean", [
    ("tutorial_cnn", 4, 2, "SGD", 0.001, [0.5, 0.5, 0.5]),
    ("tutorial_mlp", 64, 10, "Adam", 0.001, [0.5]),
])
def test_tutorial_configs_hold_the_tutorials_settings(config, batch, epochs, optimizer, lr, mean,
                                                     capsys):
    config = printed(["--model", config], capsys)
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    assert (data["batch_size"], config["trainer"]["max_epochs"]) == (batch, epochs)
    assert (model["optimizer"]["init_args"]["lr"], model["mean"]) == (lr, mean)
    assert model["optimizer"]["class_path"] == f"torch.optim.{optimizer}"
    assert model["scheduler"] is None and model["label_smoothing"] == 0
    assert data["val_size"] == 0


def test_a_run_without_validation_trains_on_everything_and_tests_the_last_weights(
        mnist_dir, in_tmp, capsys):
    args = ["--model", "tutorial_mlp", "--data.data_dir", str(mnist_dir), "--trainer.max_epochs",
            "2"]
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
    record = results(run)
    assert record["global_step"] == 2 * (600 // 64) and "val/acc_best" not in record["metrics"]
    assert record["best_model_path"] is None and record["tested"] == "the weights as trained"
    assert record["metrics"]["test/acc"] > 0.5
    # It has no best checkpoint: `best` is an error, never another run's file; `last` tests.
    capsys.readouterr()
    assert run_train(["test", "--ckpt_path", "best"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("train.py: error: --ckpt_path best: the run lightning_logs/version_0 "
                           "has no best checkpoint")
    assert run_train(["test", "--ckpt_path", "last"]) == 0


@pytest.mark.parametrize("args, said", [
    (["--model", "no_such_recipe"],
     f"unknown recipe 'no_such_recipe' (--model NAME is configs/NAME.yaml); choose one of: "
     f"{', '.join(command_line.recipes())}"),
    (["--data", "no_such_data"], "no_such_data"),
    (["--model.net", "NoSuchNet"], "NoSuchNet"),
    (["no_such_command"], "unknown subcommand 'no_such_command'; choose one of: fit, validate, "
                          "test, predict, export"),
])
def test_unknown_names_exit_2_in_one_line(args, said, in_tmp, capsys):
    assert run_train(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("train.py: error: ") and said in line
    assert list(in_tmp.iterdir()) == []


def test_help_names_the_recipes_the_data_and_the_options(capsys):
    assert run_train(["--help"]) == 0
    out = capsys.readouterr().out
    described = "".join(out.split("\n\n")[1].split())  # wrapped anywhere
    names = [*command_line.recipes(), "MNISTDataModule", "FashionMNISTDataModule",
             "CIFAR10DataModule", "ImageFolderDataModule"]
    assert all(name in described for name in names)
    options = ("--trainer.max_epochs", "--seed_everything", "--ckpt_path", "--optimizer",
               "--lr_scheduler")
    assert all(name in out for name in options)
    assert run_train(["--model.help", "ImageClassifier"], quiet=False) == 0
    net = " ".join(capsys.readouterr().out.split("--model.net NET")[-1].split())
    assert "lit_models.networks.NETWORKS" in net and "import path" in net
    # The network's own settings.
    assert run_train(["--model.net.help", "TutorialCNN"], quiet=False) == 0
    widths = capsys.readouterr().out
    assert all(f"--net.{name}" in widths for name in ("channels", "hidden")) and "[6, 16]" in widths
    assert run_train(["--data.help", "CIFAR10DataModule"], quiet=False) == 0
    assert "--data.crop_padding" in capsys.readouterr().out


def test_same_seed_same_numbers_and_a_random_seed_is_recorded(mnist_dir, in_tmp, monkeypatch):
    """`--seed_everything true` is Lightning's (its seed_everything(None): PL_GLOBAL_SEED, or 0):
    config.yaml and the record keep the seed it set, which runs the same numbers again."""
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT, *FEW]
    for extra in (["--seed_everything", "true"], ["--seed_everything", "1"], []):
        # Where Lightning's seed_everything(None) looks first, as a new process finds it.
        monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
        assert run_train(args + extra) == 0
    chosen, other, default = (results(r) for r in runs(in_tmp))
    seeds = [yaml.safe_load((r / "config.yaml").read_text())["seed_everything"]
             for r in runs(in_tmp)]
    assert seeds[1:] == [1, 0] and [r["seed"] for r in (chosen, other, default)] == seeds
    loss = {seed: r["metrics"]["test/loss"] for seed, r in zip(seeds, (chosen, other, default))}
    assert seeds[0] in (0, 1) and chosen["metrics"]["test/loss"] == loss[seeds[0]]
    assert loss[0] != loss[1]


def test_compile_trains_the_same_network(mnist_dir, in_tmp, monkeypatch):
    """`--model.compile true` runs the network through torch.compile: here with a backend that
    counts the graphs it is given and runs them as they are, not inductor's C++ build (tens of
    seconds on a CPU)."""
    graphs = []

    def counting(graph, example_inputs):
        """A torch.compile backend: the graph, run eagerly."""
        graphs.append(graph)
        return graph.forward

    compile_module = torch.nn.Module.compile

    def compile_counting(self, *args, **kwargs):
        """Module.compile with the counting backend."""
        return compile_module(self, *args, **{**kwargs, "backend": counting})

    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT, *FEW]
    assert run_train(args) == 0
    monkeypatch.setattr(torch.nn.Module, "compile", compile_counting)
    assert run_train(args + ["--model.compile", "true"]) == 0
    plain, compiled = (results(r)["metrics"] for r in runs(in_tmp))
    assert graphs and compiled["test/acc"] == pytest.approx(plain["test/acc"], abs=0.02)


def test_the_default_progress_bar_is_lightnings_redrawn_every_ten_batches(capsys):
    callbacks = printed(["--model", "mlp"], capsys)["trainer"]["callbacks"]
    (bar,) = [c for c in callbacks if c["class_path"].endswith("ProgressBar")]
    assert bar["class_path"] == "lightning.pytorch.callbacks.TQDMProgressBar"
    assert bar["init_args"]["refresh_rate"] == 10


# --- extending: a network and a data set of one's own, from their own module
# -------------------------------------------------------------------------------------------------

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


def test_a_network_and_a_data_set_of_ones_own_train_from_the_command_line(own_modules,
                                                                         monkeypatch, capsys):
    tmp_path = own_modules
    (tmp_path / "mine.py").write_text(textwrap.dedent(EXTENSION))
    optimizer = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.05}}
    net = {"class_path": "mine.TinyNet", "init_args": {"hidden": 16}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({
        "model": {"class_path": "lit_models.ImageClassifier",
                  "init_args": {"net": net, "optimizer": optimizer}},
        "data": {"class_path": "mine.Stripes", "init_args": {"batch_size": 32}},
        "trainer": {"max_epochs": 2},
    }))
    monkeypatch.chdir(tmp_path)
    assert run_train(["--config", "tiny.yaml"]) == 0, capsys.readouterr().err[-2000:]
    record = results(runs(tmp_path)[0])
    assert record["metrics"]["test/acc"] == 1.0
    assert (record["data"], record["network"]) == ("stripes", "TinyNet")
    assert set(record["test/acc_per_class"]) == {"horizontal", "vertical"}
    capsys.readouterr()
    assert run_train(["test", "--ckpt_path", "best"]) == 0
    assert "test/acc 1.0000" in capsys.readouterr().out


@pytest.mark.parametrize("recipe", command_line.recipes())
def test_every_recipe_runs_the_network_data_and_length_it_writes(recipe, capsys):
    """And the quick ones train on every image (no validation split) and test the last weights
    (no best checkpoint)."""
    written = yaml.safe_load((command_line.RECIPES / f"{recipe}.yaml").read_text())
    config = printed(["--model", recipe], capsys)
    net = config["model"]["init_args"]["net"]["class_path"]
    assert net == written["model"]["init_args"]["net"]["class_path"]
    assert config["data"]["class_path"] == written["data"]["class_path"]
    assert config["trainer"]["max_epochs"] == written["trainer"]["max_epochs"]
    for key, value in written["data"].get("init_args", {}).items():
        assert config["data"]["init_args"][key] == value, key
    for key, value in written["model"]["init_args"]["optimizer"]["init_args"].items():
        assert config["model"]["init_args"]["optimizer"]["init_args"][key] == value, key
    if recipe in QUICK:
        arch, epochs = QUICK[recipe]
        assert config["data"]["init_args"]["val_size"] == 0
        assert (net, config["trainer"]["max_epochs"]) == (f"lit_models.Tutorial{arch}", epochs)
        assert not any("ModelCheckpoint" in c["class_path"]
                       for c in config["trainer"]["callbacks"])


QUICK = {"quick_cnn": ("CNN", 1), "quick_mlp": ("MLP", 4), "quick_cnn_gpu": ("CNN", 4),
         "quick_mlp_gpu": ("MLP", 8)}


def test_the_registries_hold_the_built_in_names():  # and more once a user adds some
    assert {"cnn", "mlp", "whitened"} <= set(NETWORKS)
    assert {"cnn", "mlp", "tutorial_cnn", "tutorial_mlp", "whitened", *QUICK} <= set(
        command_line.recipes())


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
    assert run_train(["--config", str(trained.run / "config.yaml"), "--trainer.callbacks+=EMA",
                      "--trainer.callbacks.decay=0.9"]) == 0
    checkpoint = torch.load(newest(trained.cwd) / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(checkpoint["averaging_state"]["n_averaged"]) == checkpoint["global_step"] == 24
    averaged, current = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert not torch.equal(averaged["net.fc1.weight"], current["net.fc1.weight"])


@pytest.mark.slow
def test_an_installed_copy_finds_its_recipes_and_has_its_commands(tmp_path):
    """pyproject.toml's packages: the installed copy imports every package train.py and sweep.py
    use (lit_sweep among them), and no retired one (lit_common)."""
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                              "--no-build-isolation", "--target", str(target), str(ROOT)],
                             capture_output=True, text=True, cwd=tmp_path)
    assert install.returncode == 0, install.stderr[-2000:]
    for name, module in (("lit-train", "train"), ("lit-sweep", "sweep")):
        script = (target / "bin" / name).read_text()
        assert f"from lit_image_classifiers.{module} import main" in script
    assert (target / "lit_sweep").is_dir() and not (target / "lit_common").exists()
    code = ("import sys, lit_sweep, lit_image_classifiers.train as t; print(t.__file__); "
            "sys.argv[1:] = ['--model', 'quick_mlp', '--print_config']; sys.exit(t.main())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(str(target)) and "quick" not in proc.stdout.split("\n", 1)[0]
    assert yaml.safe_load(proc.stdout.split("\n", 1)[1])["data"]["init_args"]["val_size"] == 0
