"""What a researcher varies reaches the model, and means what it says: the network's widths and
depth, the learning rate, the optimizer, the loss, mixup (issue 25); a class named on the command
line starts from its own defaults; and the input contract: the project's model on a user's data
module as Lightning's docs write one (issue 56, item 8 and defect 8)."""

import textwrap
from functools import partial

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import ROOT, class_images, results, run_train, runs, sweep_here, write_mnist
from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.core.saving import load_hparams_from_yaml
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
    """The tiny MNIST IDX files, shared by this module's tests."""
    return write_mnist(tmp_path_factory.mktemp("mnist"))


def checkpoint(run) -> dict:
    """The run's last.ckpt."""
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def shapes(run) -> dict:
    """The shape of each of the network's weights in the run's last checkpoint."""
    weights = checkpoint(run)["state_dict"]
    return {k: tuple(v.shape) for k, v in weights.items() if k.startswith("net.")}


def printed(args: list[str], capsys) -> dict:
    """The configuration `--print_config` prints for the command line `args`."""
    capsys.readouterr()
    assert run_train([*args, "--print_config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def sgd(lr: float = 0.01, **kwargs):
    """The optimizer argument of an ImageClassifier made in Python: SGD at `lr`."""
    return partial(torch.optim.SGD, lr=lr, **kwargs)


# --- the network's own settings
# -------------------------------------------------------------------------------------------------


def test_the_mlps_hidden_width_is_an_option(mnist, in_tmp):
    args = ["--model", "mlp", "--model.net.hidden", "256", "--data.data_dir", str(mnist), *BASE]
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
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
    hparams = load_hparams_from_yaml(str(run / "hparams.yaml"))
    assert list(hparams["image_shape"]) == [1, 28, 28] and hparams["num_classes"] == 10
    assert len(hparams["class_names"]) == 10
    data = MNISTDataModule(str(mnist))
    assert hparams["mean"] == pytest.approx(data.mean) and hparams["std"] == pytest.approx(data.std)
    assert hparams["net"]["init_args"]["hidden"] == 256


def test_the_cnns_widths_and_depth_are_options(mnist, in_tmp):
    args = ["--model", "cnn", "--data", "MNISTDataModule", "--model.net.channels", "[4, 8]",
            "--model.net.hidden", "[32]", "--data.data_dir", str(mnist), *BASE]
    assert run_train(args) == 0
    assert shapes(runs(in_tmp)[0]) == {
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
    cnn = ImageClassifier("cnn", image_shape=(3, 32, 32), num_classes=10, mean=[0.5] * 3,
                          std=[0.5] * 3)
    assert [tuple(p.shape) for p in cnn.net.parameters()] == [
        (6, 3, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 400), (120,), (84, 120), (84,), (10, 84),
        (10,)]
    mlp = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.5], std=[0.5])
    assert [tuple(p.shape) for p in mlp.net.parameters()] == [(128, 784), (128,), (10, 128), (10,)]


def test_the_recipes_networks_are_the_tutorials_and_a_new_class_starts_from_its_defaults(
        tmp_path, capsys):
    for recipe, settings in (("mlp", {"hidden": 128}),
                             ("cnn", {"channels": [6, 16], "hidden": [120, 84]})):
        assert printed(["--model", recipe], capsys)["model"]["init_args"]["net"]["init_args"] == (
            settings)
    mine = tmp_path / "mine.yaml"  # a configuration that gave the CNN a width the MLP also takes
    net = {"class_path": "lit_models.TutorialCNN", "init_args": {"hidden": [50]}}
    mine.write_text(yaml.safe_dump({"model": {"init_args": {"net": net}}}))
    cli = train.TrainCLI(["--model", "cnn", "--config", str(mine), "--model.net", "TutorialMLP",
                          "--trainer.logger", "false", "--data.data_dir", str(tmp_path / "none")],
                         run=False)
    assert cli.config.model.init_args.net.init_args.hidden == 128  # not the CNN's [50]
    assert cli.model.net.fc1.out_features == 128


def test_a_network_that_cannot_be_built_says_so_in_one_line(mnist, in_tmp, capsys):
    args = ["--model", "cnn", "--data", "MNISTDataModule", "--model.net.channels", "[4, 8, 16]",
            "--data.data_dir", str(mnist), *BASE]
    assert run_train(args) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot be built for (1, 28, 28) images" in line and "fewer --model.net.channels" in line
    assert not (in_tmp / "lightning_logs").exists()


@pytest.mark.slow
def test_a_sweep_over_the_hidden_width_trains_each_width(mnist, tmp_path, capfd):
    args = ["--model", "mlp", "--grid", "model.net.hidden=16,48", "--name", "w",
            "--data.data_dir", str(mnist), *BASE]
    code, err = sweep_here(args, tmp_path, capfd)
    assert code == 0, err[-2000:]
    trials = sorted((tmp_path / "lightning_logs" / "sweeps" / "w").glob("trial_*/**/checkpoints"))
    widths = sorted(shapes(run.parent)["net.fc1.weight"] for run in trials)
    assert widths == [(16, 784), (48, 784)]


def test_python_builds_the_network_from_the_data_module(mnist, tmp_path):
    # As the README's From Python: shapes and statistics from the data.
    model = ImageClassifier("mlp")
    trainer = L.Trainer(max_steps=2, default_root_dir=tmp_path, **QUIET)
    trainer.fit(model, datamodule=MNISTDataModule(str(mnist), batch_size=64))
    assert list(model.hparams_initial["image_shape"]) == [1, 28, 28]
    assert model.hparams_initial["mean"] is not None


def test_swa_runs_on_a_model_built_before_fitting_and_is_refused_on_one_built_late(mnist, tmp_path):
    data = MNISTDataModule(str(mnist), batch_size=64)
    model = ImageClassifier("mlp")
    model.take_from_data(data)  # what train.py does: the network exists before callbacks look at it
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)
    trainer = L.Trainer(max_epochs=2, callbacks=[swa], default_root_dir=tmp_path, **QUIET)
    trainer.fit(model, datamodule=data)
    assert swa.n_averaged >= 1  # Lightning's SWA averaged the second epoch
    late = L.Trainer(max_epochs=2, callbacks=[StochasticWeightAveraging(swa_lrs=0.01)], **QUIET)
    with pytest.raises(ModelError, match="StochasticWeightAveraging .* needs it before"):
        late.fit(ImageClassifier("mlp"), datamodule=data)


# --- one learning rate: the optimizer's; a class named starts from its own defaults
# -------------------------------------------------------------------------------------------------


def test_the_learning_rate_is_the_optimizers_and_a_wrong_one_is_one_line(mnist, in_tmp, capsys):
    args = ["--model", "mlp", "--data.data_dir", str(mnist), *BASE]
    assert run_train([*args, "--model.optimizer.lr", "0.007"]) == 0
    state = checkpoint(runs(in_tmp)[0])
    assert state["optimizer_states"][0]["param_groups"][0]["max_lr"] == 0.007  # OneCycle's peak
    assert state["hyper_parameters"]["optimizer"]["init_args"]["lr"] == 0.007
    capsys.readouterr()
    assert run_train([*args, "--model.optimizer.lr", "-1"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == "train.py: error: --model.optimizer: Invalid learning rate: -1.0"


def test_another_optimizer_class_starts_from_its_own_defaults(mnist, in_tmp, capsys):
    """Defect 8's class: `--model.optimizer SGD` after the AdamW recipe kept AdamW's weight decay
    in the configuration."""
    args = ["--model", "mlp", "--model.optimizer", "SGD", "--model.optimizer.momentum", "0.9",
            "--data.data_dir", str(mnist), *BASE]
    given = printed(args, capsys)["model"]["init_args"]["optimizer"]["init_args"]
    assert (given["weight_decay"], given["momentum"], given["lr"]) == (0, 0.9, 0.001)
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
    group = checkpoint(run)["optimizer_states"][0]["param_groups"][0]
    assert group["weight_decay"] == 0 and not group["fused"]  # not AdamW's 0.05 and fused
    recorded = yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]["optimizer"]
    assert recorded["init_args"]["weight_decay"] == 0 and recorded["init_args"]["momentum"] == 0.9


@pytest.mark.parametrize("args, expected", [
    # Another data class: its own defaults, not the MLP recipe's batch of 1536.
    (["--model", "mlp", "--data", "CIFAR10DataModule"],
     {"batch_size": 128, "crop_padding": 4, "flip": True}),
    # A subclass of the recipe's: the recipe's settings, and those given after it.
    (["--model", "mlp", "--data", "FashionMNISTDataModule"], {"batch_size": 1536}),
    (["--model", "tutorial_mlp", "--data", "FashionMNISTDataModule", "--data.val_size", "100"],
     {"batch_size": 64, "val_size": 100}),
    (["--model", "cnn", "--data", "MNISTDataModule", "--data.batch_size", "32"],
     {"batch_size": 32, "crop_padding": 0}),
])
def test_a_data_class_named_on_the_command_line_starts_from_its_own_defaults(args, expected,
                                                                           capsys):
    data = printed(args, capsys)["data"]["init_args"]
    assert {key: data[key] for key in expected} == expected


def test_a_loaded_checkpoint_fine_tunes_with_its_runs_optimizer_and_schedule(mnist, in_tmp):
    args = ["--model", "cnn", "--data", "MNISTDataModule", "--data.data_dir", str(mnist), *BASE,
            "--trainer.limit_train_batches", "2"]
    assert run_train(args) == 0
    model = ImageClassifier.load_from_checkpoint(runs(in_tmp)[0] / "checkpoints" / "last.ckpt")
    trainer = L.Trainer(max_steps=2, **QUIET)
    trainer.fit(model, datamodule=MNISTDataModule(str(mnist), batch_size=64))
    optimizer, schedule = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["nesterov"]
    assert optimizer.defaults["weight_decay"] == 0.0005  # configs/cnn.yaml's
    assert isinstance(schedule, OneCycle) and schedule.total_steps == 2


# --- the loss as an extension point
# -------------------------------------------------------------------------------------------------


class Doubled(ImageClassifier):
    """A loss of one's own: one method."""

    def training_loss(self, logits, targets):
        return 2 * F.cross_entropy(logits, targets)


def test_a_loss_is_one_method_and_the_logged_training_loss_is_it(mnist):
    data = MNISTDataModule(str(mnist), batch_size=64, val_size=0)
    # No learning to speak of: the loss of the same weights, twice over.
    model = Doubled("mlp", optimizer=sgd(1e-12))
    trainer = L.Trainer(max_epochs=1, limit_train_batches=3, **QUIET)
    trainer.fit(model, datamodule=data)
    # Epoch 0's first three batches, again.
    batches = [batch for _, batch in zip(range(3), data.train_dataloader())]
    plain = torch.stack([F.cross_entropy(model(x), y) for x, y in batches]).mean()
    logged = float(trainer.callback_metrics["train/loss"])
    assert logged == pytest.approx(2 * float(plain), rel=1e-4)


def test_mixup_is_an_option_seeded_by_the_step_with_honest_training_accuracy(mnist):
    model = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, mean=[0.5], std=[0.5],
                            mixup=0.4, optimizer=partial(torch.optim.AdamW, lr=0.01))
    images, labels = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8), torch.arange(8)
    mixed, targets = model.mix(images, labels)
    again, _ = model.mix(images, labels)
    # The same step mixes the same way.
    assert torch.equal(mixed, again) and targets.shape == (8, 10)
    assert torch.allclose(targets.sum(1), torch.ones(8)) and (targets.max(1).values < 1).all()
    data = MNISTDataModule(str(mnist), batch_size=64, val_size=0)
    trainer = L.Trainer(max_epochs=2, **QUIET)
    trainer.fit(model, datamodule=data)
    # Counted by the predicted class's share of each mixed label: never all 1.
    assert 0.3 < float(trainer.callback_metrics["train/acc"]) < 1


def test_mixup_and_cutmix_from_the_command_line(mnist, in_tmp):
    args = ["--model", "cnn", "--data", "MNISTDataModule", "--model.mixup", "0.2",
            "--model.cutmix", "1.0", "--data.data_dir", str(mnist), *BASE,
            "--trainer.limit_train_batches", "3"]
    assert run_train(args) == 0
    (run,) = runs(in_tmp)
    assert results(run)["global_step"] == 3 and 0 < results(run)["metrics"]["train/acc"] < 1


# --- the input contract: the model on a user's data module (item 8)
# -------------------------------------------------------------------------------------------------

# A LightningDataModule as Lightning's docs write one: torchvision's MNIST through ToTensor (and
# Normalize), random_split, DataLoaders; no image_shape or classes attributes.
DIGITS = '''
import lightning as L
import torch
from torch.utils.data import DataLoader, random_split
from torchvision import transforms
from torchvision.datasets import MNIST


class DigitsFolder(L.LightningDataModule):
    def __init__(self, data_dir: str = "./data", batch_size: int = 64, normalize: bool = True):
        super().__init__()
        self.data_dir, self.batch_size = data_dir, batch_size
        steps = [transforms.ToTensor()]
        if normalize:
            steps.append(transforms.Normalize((0.1307,), (0.3081,)))
        self.transform = transforms.Compose(steps)

    def setup(self, stage):
        full = MNIST(self.data_dir, train=True, transform=self.transform)
        self.train_set, self.val_set = random_split(full, [540, 60],
                                                    generator=torch.Generator().manual_seed(42))
        self.test_set = MNIST(self.data_dir, train=False, transform=self.transform)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size)
'''


@pytest.fixture
def digits(own_modules, monkeypatch, mnist):
    """The user's data module mine.DigitsFolder on the path, in the working folder; its data."""
    (own_modules / "mine.py").write_text(textwrap.dedent(DIGITS))
    monkeypatch.chdir(own_modules)
    return ["--model", "mlp", "--data", "mine.DigitsFolder", "--data.data_dir", str(mnist),
            "--trainer.max_epochs", "2"]


def test_a_users_data_module_is_told_in_one_line_all_that_the_model_needs(digits, own_modules,
                                                                          capsys):
    """Defect 8: `--model mlp --data mine.DigitsFolder` asked first for the image shape and
    classes, then for the mean and std, then refused float batches: one refusal at a time."""
    assert run_train(digits) == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("train.py:")]
    assert line == ("train.py: error: the data module DigitsFolder does not say the images' "
                    "image_shape and num_classes: give them to the model (--model.image_shape "
                    "... --model.num_classes ...)")
    assert not (own_modules / "lightning_logs").exists()  # refused before anything trained


@pytest.mark.parametrize("normalize", ["true", "false"])
def test_the_model_takes_a_users_totensor_batches_as_they_are_at_the_modules_batch_size(
        normalize, digits, own_modules, capsys):
    """Defect 8: once told the image shape and classes, the model trains on ToTensor batches (with
    or without Normalize) as they come, never normalised again, at the data module's own batch
    size of 64: the MLP recipe's 1536 had replaced it without a word."""
    given = ["--model.image_shape", "[1, 28, 28]", "--model.num_classes", "10",
             "--data.normalize", normalize]
    assert printed([*digits, *given], capsys)["data"]["init_args"]["batch_size"] == 64
    assert run_train([*digits, *given]) == 0
    (run,) = runs(own_modules)
    record = results(run)
    assert record["global_step"] == 2 * 9 and record["metrics"]["test/acc"] > 0.5  # 540 / 64
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["init_args"]["batch_size"] == 64
    model = ImageClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt").eval()
    images = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(images), model.net(images))  # floats as they are
    assert model.hparams.mean == [0.0] and model.hparams.std == [1.0]


class TorchvisionStyle(L.LightningDataModule):
    """A plain data module as torchvision's tutorials write one: ToTensor() and Normalize() floats,
    learnable (each class a bright square), no image_shape or classes."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        images, labels = (torch.from_numpy(a) for a in class_images(256, 1, 28))
        self.labels, self.images = labels, images.permute(0, 3, 1, 2).contiguous()
        if dtype.is_floating_point:
            self.images = (self.images.float() / 255 - 0.5) / 0.5

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.images, self.labels), batch_size=32, shuffle=True)


def test_float_batches_train_as_they_are_from_python():
    model = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10, optimizer=sgd(0.1))
    trainer = L.Trainer(max_epochs=5, **QUIET)
    data = TorchvisionStyle()
    trainer.fit(model, datamodule=data)
    model.eval()
    with torch.no_grad():
        accuracy = (model(data.images).argmax(1) == data.labels).float().mean()
        assert torch.equal(model(data.images[:4]), model.net(data.images[:4]))
    assert accuracy > 0.5  # not chance (0.1)


def test_a_plain_data_module_works_once_the_model_is_told_what_it_cannot_know():
    with pytest.raises(ModelError, match=r"does not say the images' image_shape and num_classes: "
                                         r"give them to the model"):
        L.Trainer(max_steps=1, **QUIET).fit(ImageClassifier("mlp"),
                                            datamodule=TorchvisionStyle(torch.uint8))
    model = ImageClassifier("mlp", image_shape=(1, 28, 28), num_classes=10)
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
    """The project's data modules on tiny data, as a plain LightningModule meets them."""
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


def test_the_readmes_network_and_loss_of_ones_own_train_from_the_command_line(mnist, own_modules,
                                                                              monkeypatch, capsys):
    import re

    readme = (ROOT / "README.md").read_text()
    for name in ("my_nets", "my_losses"):
        (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                   if b.startswith(f"# {name}.py")]
        (own_modules / f"{name}.py").write_text(code)
    (recipe,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "my_nets.Wide" in b]
    (own_modules / "wide.yaml").write_text(recipe)
    monkeypatch.chdir(own_modules)
    args = ["--config", "wide.yaml", "--model", "my_losses.Focal", "--model.net.hidden", "24",
            "--data.data_dir", str(mnist), *BASE]
    assert run_train(args) == 0, capsys.readouterr().err[-2000:]
    (run,) = runs(own_modules)
    assert shapes(run)["net.1.weight"] == (24, 784)
    config = yaml.safe_load((run / "config.yaml").read_text())["model"]
    assert config["class_path"] == "my_losses.Focal"
    assert config["init_args"]["net"]["class_path"] == "my_nets.Wide"


def test_a_partial_network_from_python_is_kept_in_the_checkpoint(mnist, tmp_path):
    from lit_models import TutorialMLP

    model = ImageClassifier(partial(TutorialMLP, hidden=32), optimizer=sgd(0.01, momentum=0.5))
    trainer = L.Trainer(max_steps=1, **QUIET)
    trainer.fit(model, datamodule=MNISTDataModule(str(mnist), batch_size=64))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    hparams = torch.load(tmp_path / "m.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["net"] == {"class_path": "lit_models.networks.TutorialMLP",
                              "init_args": {"hidden": 32}}
    loaded = ImageClassifier.load_from_checkpoint(tmp_path / "m.ckpt")
    assert loaded.net.fc1.out_features == 32
    assert loaded.configure_optimizers().defaults["momentum"] == 0.5
