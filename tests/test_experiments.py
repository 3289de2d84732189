"""What a researcher varies reaches the model, and means what it says: the network's widths and
depth, the learning rate, the optimizer, the loss, mixup, and the input contract (issue 25)."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import ROOT, run_train, runs, sweep_here, write_mnist
from lightning.pytorch.callbacks import StochasticWeightAveraging
from torch.utils.data import DataLoader, TensorDataset

import train
from datamodules import MNISTDataModule
from lit_models import ImageClassifier, ModelError, OneCycle

BASE = ["--data.batch_size", "64", "--trainer.max_epochs", "1"]
QUIET = {
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "enable_checkpointing": False,
}


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    return write_mnist(tmp_path_factory.mktemp("mnist"))


def weights(run) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def shapes(run) -> dict:
    return {k: tuple(v.shape) for k, v in weights(run).items() if k.startswith("net.")}


# --- the network's own settings
# --------------------------------------------------------------------------------


def test_the_mlps_hidden_width_is_an_option(mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            ["--model", "mlp", "--model.net.hidden", "256", "--data.data_dir", str(mnist), *BASE]
        )
        == 0
    )
    (run,) = runs(tmp_path)
    assert shapes(run) == {
        "net.fc1.weight": (256, 784),
        "net.fc1.bias": (256,),
        "net.fc2.weight": (10, 256),
        "net.fc2.bias": (10,),
    }  # 784-256-10
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["net"] == {
        "class_path": "lit_models.TutorialMLP",
        "init_args": {"hidden": 256},
    }
    # What Lightning logged (hparams.yaml, TensorBoard's HParams) is what the model used, not nulls.
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    assert (
        hparams["image_shape"] == [1, 28, 28]
        and hparams["num_classes"] == 10
        and len(hparams["class_names"]) == 10
    )
    data = MNISTDataModule(str(mnist))
    assert hparams["mean"] == pytest.approx(data.mean) and hparams["std"] == pytest.approx(data.std)
    assert hparams["net"]["init_args"]["hidden"] == 256


def test_the_cnns_widths_and_depth_are_options(mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                "cnn",
                "--data",
                "mnist",
                "--model.net.channels",
                "[4, 8]",
                "--model.net.hidden",
                "[32]",
                "--data.data_dir",
                str(mnist),
                *BASE,
            ]
        )
        == 0
    )
    assert shapes(runs(tmp_path)[0]) == {
        "net.conv1.weight": (4, 1, 5, 5),
        "net.conv1.bias": (4,),
        "net.conv2.weight": (8, 4, 5, 5),
        "net.conv2.bias": (8,),
        "net.fc1.weight": (32, 128),
        "net.fc1.bias": (32,),
        "net.fc2.weight": (10, 32),
        "net.fc2.bias": (10,),
    }


def test_the_defaults_are_the_tutorials_layers():
    cnn = ImageClassifier(
        "cnn", image_shape=(3, 32, 32), num_classes=10, mean=[0.5] * 3, std=[0.5] * 3
    )
    assert [tuple(p.shape) for p in cnn.net.parameters()] == [
        (6, 3, 5, 5),
        (6,),
        (16, 6, 5, 5),
        (16,),
        (120, 400),
        (120,),
        (84, 120),
        (84,),
        (10, 84),
        (10,),
    ]
    mlp = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.5], std=[0.5])
    assert [tuple(p.shape) for p in mlp.net.parameters()] == [(128, 784), (128,), (10, 128), (10,)]


def test_the_recipes_networks_are_the_tutorials_and_a_new_class_starts_from_its_defaults(
    tmp_path, capsys
):
    for recipe, settings in (
        ("mlp", {"hidden": 128}),
        ("cnn", {"channels": [6, 16], "hidden": [120, 84]}),
    ):
        assert run_train(["--model", recipe, "--print_config"]) == 0
        assert (
            yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["net"]["init_args"]
            == settings
        )
    mine = tmp_path / "mine.yaml"  # a configuration that gave the CNN a width the MLP also takes
    mine.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "init_args": {
                        "net": {
                            "class_path": "lit_models.TutorialCNN",
                            "init_args": {"hidden": [50]},
                        }
                    }
                }
            }
        )
    )
    cli = train.TrainCLI(
        [
            "--model",
            "cnn",
            "--config",
            str(mine),
            "--model.net",
            "mlp",
            "--trainer.logger",
            "false",
            "--data.data_dir",
            str(tmp_path / "none"),
        ],
        run=False,
    )
    assert cli.config.model.init_args.net.init_args.hidden == 128  # not the CNN's [50]
    assert (
        "--model.net lit_models.networks.TutorialMLP starts from its own defaults: hidden"
        in capsys.readouterr().err
    )


def test_a_network_that_cannot_be_built_says_so_in_one_line(mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                "cnn",
                "--data",
                "mnist",
                "--model.net.channels",
                "[4, 8, 16]",
                "--data.data_dir",
                str(mnist),
                *BASE,
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot be built for (1, 28, 28) images" in err and "fewer --model.net.channels" in err


@pytest.mark.slow
def test_a_sweep_over_the_hidden_width_trains_each_width(mnist, tmp_path, capfd):
    args = ["--model", "mlp", "--grid", "model.net.hidden=16,48", "--name", "w",
            "--data.data_dir", str(mnist), *BASE]
    code, err = sweep_here(args, tmp_path, capfd)  # sweep.main here; its worker is a process
    assert code == 0, err[-2000:]
    trials = sorted(
        (tmp_path / "lightning_logs" / "sweeps" / "w").glob("trial_*/lightning_logs/version_0")
    )
    assert sorted(shapes(run)["net.fc1.weight"] for run in trials) == [(16, 784), (48, 784)]


def test_python_builds_the_network_from_the_data_module(mnist, tmp_path):
    model = ImageClassifier(
        "mlp"
    )  # as the README's From Python: shapes and statistics from the data
    trainer = L.Trainer(max_steps=2, default_root_dir=tmp_path, **QUIET)
    trainer.fit(model, datamodule=MNISTDataModule(str(mnist), batch_size=64))
    assert (
        model.hparams_initial["image_shape"] == [1, 28, 28]
        and model.hparams_initial["mean"] is not None
    )


def test_swa_runs_on_a_model_built_before_fitting_and_is_refused_on_one_built_late(mnist, tmp_path):
    data = MNISTDataModule(str(mnist), batch_size=64)
    model = ImageClassifier("mlp")
    model.take_from_data(data)  # what train.py does: the network exists before callbacks look at it
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)
    L.Trainer(max_epochs=2, callbacks=[swa], default_root_dir=tmp_path, **QUIET).fit(
        model, datamodule=data
    )
    assert swa.n_averaged >= 1  # Lightning's SWA averaged the second epoch
    late = L.Trainer(max_epochs=2, callbacks=[StochasticWeightAveraging(swa_lrs=0.01)], **QUIET)
    with pytest.raises(
        ModelError, match="StochasticWeightAveraging copies the model before it is built"
    ):
        late.fit(ImageClassifier("mlp"), datamodule=data)


# --- one learning rate; the optimizer as given
# -----------------------------------------------------------------


def test_an_optimizer_lr_beside_model_lr_is_refused_naming_the_option(
    mnist, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    for value in ("0.5", "-1"):
        assert (
            run_train(
                [
                    "--model",
                    "mlp",
                    "--model.optimizer.lr",
                    value,
                    "--data.data_dir",
                    str(mnist),
                    *BASE,
                ]
            )
            == 2
        )
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"--model.optimizer.lr {float(value)}: the learning rate is --model.lr" in err
        assert f"give --model.lr {float(value)}" in err
    assert not (tmp_path / "lightning_logs").exists()


def test_model_lr_null_runs_at_the_optimizers_lr(mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                "mlp",
                "--model.lr",
                "null",
                "--model.optimizer.lr",
                "0.007",
                "--data.data_dir",
                str(mnist),
                *BASE,
            ]
        )
        == 0
    )
    state = torch.load(runs(tmp_path)[0] / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["optimizer_states"][0]["param_groups"][0]["max_lr"] == 0.007  # OneCycle's peak


def test_another_optimizer_class_starts_from_its_own_defaults(mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                "mlp",
                "--model.optimizer",
                "SGD",
                "--model.optimizer.momentum",
                "0.9",
                "--data.data_dir",
                str(mnist),
                *BASE,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert (
        "--model.optimizer SGD starts from its own defaults: fused, weight_decay of the "
        "configuration" in err
    )
    (run,) = runs(tmp_path)
    group = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0][
        "param_groups"
    ][0]
    assert group["weight_decay"] == 0 and not group["fused"]  # not AdamW's 0.05 and fused
    recorded = yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]["optimizer"]
    assert (
        recorded["init_args"]["weight_decay"] == 0 and recorded["init_args"]["momentum"] == 0.9
    )  # what ran


def test_a_loaded_checkpoint_fine_tunes_with_its_runs_optimizer_and_schedule(
    mnist, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(["--model", "cnn", "--data", "mnist", "--data.data_dir", str(mnist), *BASE]) == 0
    )
    model = ImageClassifier.load_from_checkpoint(runs(tmp_path)[0] / "checkpoints" / "last.ckpt")
    trainer = L.Trainer(max_steps=2, **QUIET)
    trainer.fit(model, datamodule=MNISTDataModule(str(mnist), batch_size=64))
    optimizer, schedule = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
    assert (
        type(optimizer) is torch.optim.SGD
        and optimizer.defaults["nesterov"]
        and optimizer.defaults["weight_decay"] == 0.0005
    )  # configs/cnn.yaml's
    assert isinstance(schedule, OneCycle) and schedule.total_steps == 2


# --- the loss as an extension point
# ----------------------------------------------------------------------------


class Doubled(ImageClassifier):
    """A loss of one's own: one method."""

    def training_loss(self, logits, targets):
        return 2 * F.cross_entropy(logits, targets)


def test_a_loss_is_one_method_and_the_logged_training_loss_is_it(mnist, tmp_path):
    data = MNISTDataModule(str(mnist), batch_size=64, val_size=0)
    model = Doubled(
        "mlp", lr=1e-12
    )  # no learning to speak of: the loss of the same weights, twice over
    trainer = L.Trainer(max_epochs=1, limit_train_batches=3, **QUIET)
    trainer.fit(model, datamodule=data)
    batches = [
        batch for _, batch in zip(range(3), data.train_dataloader())
    ]  # epoch 0's first three, again
    plain = torch.stack(
        [F.cross_entropy(model(images), labels) for images, labels in batches]
    ).mean()
    assert float(trainer.callback_metrics["train/loss"]) == pytest.approx(
        2 * float(plain), rel=1e-4
    )


def test_mixup_is_an_option_seeded_by_the_step_with_honest_training_accuracy(mnist, tmp_path):
    model = ImageClassifier(
        "mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.5], std=[0.5], mixup=0.4, lr=0.01
    )
    images, labels = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8), torch.arange(8)
    mixed, targets = model.mix(images, labels)
    again, _ = model.mix(images, labels)
    assert torch.equal(mixed, again) and targets.shape == (
        8,
        10,
    )  # the same step mixes the same way
    assert torch.allclose(targets.sum(1), torch.ones(8)) and (targets.max(1).values < 1).all()
    data = MNISTDataModule(str(mnist), batch_size=64, val_size=0)
    trainer = L.Trainer(max_epochs=2, **QUIET)
    trainer.fit(model, datamodule=data)
    accuracy = float(trainer.callback_metrics["train/acc"])
    assert (
        0.3 < accuracy < 1
    )  # counted by the predicted class's share of each mixed label: never all 1


def test_mixup_and_cutmix_from_the_command_line(mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        run_train(
            [
                "--model",
                "cnn",
                "--data",
                "mnist",
                "--model.mixup",
                "0.2",
                "--model.cutmix",
                "1.0",
                "--data.data_dir",
                str(mnist),
                *BASE,
            ]
        )
        == 0
    )


# --- the input contract
# ----------------------------------------------------------------------------------------


class TorchvisionStyle(L.LightningDataModule):
    """A plain data module as torchvision's tutorials write one: ToTensor() and Normalize()
    floats."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, 10, (256,), generator=generator)
        self.images = torch.randint(
            0, 256, (256, 1, 28, 28), dtype=torch.uint8, generator=generator
        )
        self.images = (
            (self.images.float() / 255 - 0.5) / 0.5 if dtype.is_floating_point else self.images
        )

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.images, self.labels), batch_size=32)


def test_float_batches_are_refused_in_one_line_never_trained_at_chance():
    model = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.5], std=[0.5])
    with pytest.raises(
        ModelError, match=r"takes uint8 image batches \(0..255\).*this batch is float32"
    ):
        L.Trainer(max_steps=1, **QUIET).fit(model, datamodule=TorchvisionStyle())


def test_a_plain_data_module_works_once_the_model_is_told_what_it_cannot_know():
    with pytest.raises(
        ModelError, match=r"does not say the images' image_shape, num_classes, mean, std: give them"
    ):
        L.Trainer(max_steps=1, **QUIET).fit(
            ImageClassifier("mlp"), datamodule=TorchvisionStyle(torch.uint8)
        )
    model = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.5], std=[0.5])
    trainer = L.Trainer(max_steps=3, **QUIET)
    trainer.fit(model, datamodule=TorchvisionStyle(torch.uint8))
    assert trainer.global_step == 3 and model.class_names == [str(i) for i in range(10)]


class LitDocsModel(L.LightningModule):
    """A LightningModule as Lightning's docs write one: float images in, a flattened linear layer
    (lazy: it takes any image size), a test step that logs its accuracy."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.LazyLinear(10)
        self.seen = []

    def forward(self, x):
        return self.layer(x.flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((x.dtype, float(x.min()), float(x.max())))
        return F.cross_entropy(self(x), y)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((x.dtype, float(x.min()), float(x.max())))
        self.log("test/acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SaysFloats(LitDocsModel):
    takes_uint8_images = False  # what ImageDataModule.float_images reads when it is unset


def our_data_modules(tmp_path, **kwargs):
    from conftest import write_cifar10
    from test_image_folder import write_folder

    from datamodules import CIFAR10DataModule, ImageFolderDataModule

    folder = write_folder(tmp_path / "folder", splits={"train": 40, "test": 20}, size=8)
    return [
        MNISTDataModule(str(write_mnist(tmp_path / "mnist")), batch_size=32, **kwargs),
        CIFAR10DataModule(str(write_cifar10(tmp_path / "cifar10")), batch_size=32, **kwargs),
        ImageFolderDataModule(str(folder), data_dir=str(tmp_path / "data"), batch_size=8,
                              **kwargs),
    ]


def test_a_plain_lightning_module_gets_floats_and_is_told_so_in_one_line(tmp_path, capfd):
    """As Lightning's docs feed one (ToTensor()'s floats): a model written for uint8 would get
    them without a word, so a line names the option that gives it uint8."""
    for data in our_data_modules(tmp_path):
        model = LitDocsModel()
        L.Trainer(max_steps=2, limit_val_batches=0, **QUIET).fit(model, datamodule=data)
        said = [line for line in capfd.readouterr().err.splitlines() if "float32" in line]
        assert said == ["LitDocsModel gets float32 images on the 0..1 scale, as torchvision's "
                        "ToTensor gives them (--data.float_images false: the uint8 images; or a "
                        "`takes_uint8_images` attribute of the model's)"]
        assert all(d == torch.float32 and 0 <= lo <= hi <= 1 for d, lo, hi in model.seen)


@pytest.mark.parametrize("model, option", [(LitDocsModel, {"float_images": True}),
                                           (SaysFloats, {})])
def test_a_plain_lightning_module_fits_and_tests_on_every_data_module_on_floats(model, option,
                                                                               tmp_path):
    for data in our_data_modules(tmp_path, **option):
        plain = model()
        trainer = L.Trainer(max_steps=4, limit_val_batches=0, **QUIET)
        trainer.fit(plain, datamodule=data)
        (tested,) = trainer.test(plain, datamodule=data, verbose=False)
        assert 0 <= tested["test/acc"] <= 1 and len(plain.seen) > 4
        assert all(d == torch.float32 and 0 <= lo <= hi <= 1 for d, lo, hi in plain.seen)
        assert max(hi for _, _, hi in plain.seen) > 0.5  # the 0..1 scale, not 0..1/255


@pytest.mark.slow
def test_the_readmes_network_and_loss_of_ones_own_train_from_the_command_line(mnist, own_modules,
                                                                              monkeypatch, capsys):
    tmp_path = own_modules
    import re

    readme = (ROOT / "README.md").read_text()
    for name in ("my_nets", "my_losses"):
        (code,) = [
            b
            for b in re.findall(r"```python\n(.*?)```", readme, re.S)
            if b.startswith(f"# {name}.py")
        ]
        (tmp_path / f"{name}.py").write_text(code)
    (recipe,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "my_nets.Wide" in b]
    (tmp_path / "wide.yaml").write_text(recipe)
    monkeypatch.chdir(tmp_path)
    args = ["--config", "wide.yaml", "--model", "my_losses.Focal", "--model.net.hidden", "24",
            "--data.data_dir", str(mnist), *BASE]
    assert run_train(args) == 0, capsys.readouterr().err[-2000:]
    (run,) = runs(tmp_path)
    assert shapes(run)["net.1.weight"] == (24, 784)
    config = yaml.safe_load((run / "config.yaml").read_text())["model"]
    assert config["class_path"] == "my_losses.Focal" and config["init_args"]["lr"] == 0.01


def test_a_partial_network_from_python_is_kept_in_the_checkpoint(mnist, tmp_path):
    from functools import partial

    from lit_models import TutorialMLP

    model = ImageClassifier(
        partial(TutorialMLP, hidden=32), optimizer=partial(torch.optim.SGD, momentum=0.5)
    )
    trainer = L.Trainer(max_steps=1, **QUIET)
    trainer.fit(model, datamodule=MNISTDataModule(str(mnist), batch_size=64))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    hparams = torch.load(tmp_path / "m.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["net"] == {
        "class_path": "lit_models.networks.TutorialMLP",
        "init_args": {"hidden": 32},
    }
    loaded = ImageClassifier.load_from_checkpoint(tmp_path / "m.ckpt")
    assert loaded.net.fc1.out_features == 32
    assert loaded.configure_optimizers().defaults["momentum"] == 0.5
