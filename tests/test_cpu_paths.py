"""The paths Lightning documents for a CPU, from train.py as from a plain Trainer: the strategies
for two CPU processes, `deterministic` and `benchmark`, a fit in forked processes, and the
LightningModule's own exports (`to_onnx`, `to_torchscript`) of a model trained from Python."""

import json

import lightning as L
import numpy as np
import pytest
import torch
from conftest import run_train, runs, write_mnist
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from datamodules import MNISTDataModule
from lit_models import ImageClassifier
from train import TrainCLI

CPU = ["--trainer.accelerator", "cpu"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tiny MNIST, written once for the module."""
    return write_mnist(tmp_path_factory.mktemp("data"))


def fit_args(data, *more: str) -> list[str]:
    """A fit of the MLP recipe on the CPU, with `more` options."""
    return ["--model", "mlp", "--data.data_dir", str(data), "--data.batch_size", "32", *CPU, *more]


# --- deterministic and benchmark, as Lightning's Trainer sets them --------------------------------

def torch_flags() -> tuple[bool, bool, bool]:
    """What the Trainer's `deterministic` and `benchmark` set in torch."""
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark)


def torchs_defaults() -> None:
    """torch's flags as a fresh process has them."""
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = False


@pytest.fixture
def fresh_flags():
    """torch's defaults before the test (a fresh process's), and the flags as they were after."""
    saved = torch_flags()
    torchs_defaults()
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.benchmark = saved[2]


def lightnings_flags(deterministic, benchmark) -> tuple[bool, bool, bool]:
    """What a plain Trainer with these flags sets, from torch's defaults; torch's defaults again."""
    L.Trainer(deterministic=deterministic, benchmark=benchmark, accelerator="cpu", logger=False)
    flags = torch_flags()
    torchs_defaults()
    return flags


def flag_options(deterministic, benchmark) -> list[str]:
    """The command line's options for the flags; None: not given."""
    given = {"deterministic": deterministic, "benchmark": benchmark}
    return [f"--trainer.{name}={str(value).lower()}" for name, value in given.items()
            if value is not None]


@pytest.mark.parametrize("deterministic, benchmark", [
    (None, None), (True, None), ("warn", None), (None, True), (True, True)])
def test_deterministic_and_benchmark_set_what_lightnings_trainer_sets(
        deterministic, benchmark, data, in_tmp, fresh_flags):
    expected = lightnings_flags(deterministic, benchmark)
    TrainCLI(fit_args(data, *flag_options(deterministic, benchmark)), run=False)
    assert torch_flags() == expected


def test_deterministic_warn_holds_through_a_fit_and_its_test(data, in_tmp, fresh_flags):
    expected = lightnings_flags("warn", None)
    assert run_train(fit_args(data, "--trainer.deterministic=warn", "--trainer.max_steps=2")) == 0
    assert torch_flags() == expected == (True, True, False)


# --- strategies for two CPU processes -------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["auto", "ddp_find_unused_parameters_true", "ddp_spawn",
                                      "single_device"])
def test_a_strategy_is_the_one_lightnings_trainer_builds(strategy, data, in_tmp):
    plain = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
    cli = TrainCLI(fit_args(data, "--trainer.devices=2", f"--trainer.strategy={strategy}"),
                   run=False)
    assert type(cli.trainer.strategy) is type(plain.strategy)
    assert cli.trainer.world_size == plain.world_size
    assert isinstance(plain.strategy, (DDPStrategy, SingleDeviceStrategy))


@pytest.mark.parametrize("strategy, says", [
    ("fsdp", "requires a GPU accelerator"),
    ("deepspeed", "pip install -U deepspeed"),
])
def test_lightnings_refusal_of_a_strategy_is_one_line_before_work_starts(strategy, says, data,
                                                                        in_tmp, capsys):
    assert run_train(fit_args(data, "--trainer.devices=2", f"--trainer.strategy={strategy}")) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and line.startswith("train.py: error: ") and says in line
    assert not (in_tmp / "lightning_logs").exists()


@pytest.mark.slow  # processes
def test_a_fit_in_forked_processes_from_the_command_line_keeps_its_record(data, in_tmp, capsys):
    assert run_train(fit_args(data, "--trainer.devices=2", "--trainer.strategy=ddp_fork",
                              "--trainer.max_steps=2", "--trainer.limit_val_batches=1")) == 0
    assert "ImageClassifier(mlp) on mnist: test/acc" in capsys.readouterr().out
    (run,) = runs(in_tmp)
    assert "test/acc" in json.loads((run / "results.json").read_text())["metrics"]


def forked_fit(data, tmp_path, model: ImageClassifier) -> ImageClassifier:
    """Fit `model` in two forked processes (Lightning's ddp_fork), from this one."""
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(model, datamodule=MNISTDataModule(str(data), batch_size=32))
    return model


@pytest.mark.slow  # processes
def test_a_forked_fit_gives_its_weights_back_or_refuses_a_model_not_built_yet(data, tmp_path):
    """Lightning loads the weights back with strict=False: a model without its network would drop
    them all, and a test after it would test an untrained one."""
    L.seed_everything(0, verbose=False)
    model = ImageClassifier("mlp")
    model.take_from_data(MNISTDataModule(str(data)))
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    forked_fit(data, tmp_path, model)
    assert any(not torch.equal(before[k], v) for k, v in model.net.state_dict().items())
    with pytest.raises(Exception, match="take_from_data") as refused:
        forked_fit(data, tmp_path, ImageClassifier("mlp"))
    assert "ModelError" in str(refused.value)


# --- the LightningModule's exports ----------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """An ImageClassifier trained a few steps from Python with Lightning's Trainer (a CNN that
    averages each image's logits with its mirror image's); test images."""
    folder = tmp_path_factory.mktemp("export")
    data = MNISTDataModule(str(data), batch_size=32)
    L.seed_everything(0, verbose=False)
    model = ImageClassifier("cnn", flip_test=True)
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(folder))
    trainer.fit(model, datamodule=data)
    return model.eval(), data.read("test")[0][:8], folder


def expected(model, images) -> np.ndarray:
    """What the model computes for `images`: the exports must compute the same."""
    with torch.no_grad():
        return model(images).numpy()


def test_to_onnx_writes_what_the_model_computes(trained):
    import onnxruntime

    model, images, folder = trained
    model.to_onnx(folder / "model.onnx")  # the model's example_input_array: one image
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: images[:1].numpy()})[0]
    np.testing.assert_allclose(got, expected(model, images[:1]), atol=1e-5)


@pytest.mark.parametrize("method", ["script", "trace"])
def test_to_torchscript_saves_what_the_model_computes(method, trained):
    model, images, folder = trained
    path = folder / f"model-{method}.pt"
    model.to_torchscript(path, method=method)
    loaded = torch.jit.load(str(path))
    np.testing.assert_allclose(loaded(images).detach().numpy(), expected(model, images),
                               atol=1e-5)
