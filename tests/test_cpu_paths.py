"""Every path Lightning documents for a CPU works or is refused in one line before work starts:
the strategies for two CPU processes, each combination of `deterministic` and `benchmark`, and the
LightningModule's own exports (`to_onnx`, `to_torchscript`) of a model trained from Python.
"""

import itertools

import lightning as L
import numpy as np
import pytest
import torch
from conftest import ROOT, run_process, run_train, runs
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from datamodules import MNISTDataModule
from lit_models import ImageClassifier
from train import TrainCLI

CPU = ["--trainer.accelerator", "cpu"]


def fit_args(mnist_dir, *more: str) -> list[str]:
    return ["--model", "mlp", "--data.data_dir", str(mnist_dir), "--data.batch_size", "32",
            *CPU, *more]


# --- deterministic and benchmark, as Lightning's Trainer sets them --------------------------------

def torch_flags() -> tuple[bool, bool, bool]:
    """What the Trainer's `deterministic` and `benchmark` set in torch."""
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark)


@pytest.fixture
def fresh_flags():
    """torch's defaults before the test (a fresh process's), and the flags as they were after."""
    saved = torch_flags()
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = False
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.benchmark = saved[2]


def lightnings_flags(deterministic, benchmark) -> tuple[bool, bool, bool]:
    """What a plain Trainer with these flags sets, from torch's defaults; torch's defaults again."""
    L.Trainer(deterministic=deterministic, benchmark=benchmark, accelerator="cpu", logger=False)
    flags = torch_flags()
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = False
    return flags


def flag_options(deterministic, benchmark) -> list[str]:
    """The command line's options for the flags; None: not given."""
    given = {"deterministic": deterministic, "benchmark": benchmark}
    return [f"--trainer.{name}={str(value).lower()}" for name, value in given.items()
            if value is not None]


FLAGS = list(itertools.product([None, False, True, "warn"], [None, False, True]))


@pytest.mark.parametrize("deterministic, benchmark", FLAGS)
def test_deterministic_and_benchmark_set_what_lightnings_trainer_sets(
        deterministic, benchmark, mnist_dir, in_tmp, fresh_flags):
    expected = lightnings_flags(deterministic, benchmark)
    TrainCLI(fit_args(mnist_dir, *flag_options(deterministic, benchmark)), run=False)
    assert torch_flags() == expected


def test_deterministic_warn_holds_through_a_fit_and_its_test(mnist_dir, in_tmp, fresh_flags):
    expected = lightnings_flags("warn", None)
    assert run_train(fit_args(mnist_dir, "--trainer.deterministic=warn",
                              "--trainer.max_steps=2")) == 0
    assert torch_flags() == expected == (True, True, False)


# --- strategies for two CPU processes -------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["auto", "ddp", "ddp_find_unused_parameters_true",
                                      "ddp_find_unused_parameters_false", "single_device"])
def test_a_strategy_that_runs_is_the_one_lightnings_trainer_builds(strategy, mnist_dir, in_tmp):
    plain = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
    cli = TrainCLI(fit_args(mnist_dir, "--trainer.devices=2", f"--trainer.strategy={strategy}"),
                   run=False)
    assert type(cli.trainer.strategy) is type(plain.strategy)
    assert cli.trainer.world_size == plain.world_size
    assert isinstance(plain.strategy, (DDPStrategy, SingleDeviceStrategy))


SPAWNED = [["--trainer.strategy=ddp_spawn"], ["--trainer.strategy=ddp_fork"],
           ["--trainer.strategy=ddp_notebook"],
           ["--trainer.strategy=ddp_spawn_find_unused_parameters_true"],
           ["--trainer.strategy=ddp_fork_find_unused_parameters_false"],
           ["--trainer.strategy=lightning.pytorch.strategies.DDPStrategy",
            "--trainer.strategy.start_method=spawn"]]
# Lightning's own refusals, each in one line: FSDP wants a GPU, DeepSpeed its package.
LIGHTNINGS_REFUSALS = [(["--trainer.strategy=fsdp"], 2, "requires a GPU accelerator"),
                       (["--trainer.strategy=fsdp_cpu_offload"], 2, "requires a GPU accelerator"),
                       (["--trainer.strategy=deepspeed"], 2, "pip install -U deepspeed")]


@pytest.mark.parametrize("strategy, code, says", [
    *[(args, 2, args[-1].split("=")[1]) for args in SPAWNED], *LIGHTNINGS_REFUSALS],
    ids=lambda value: value[-1].split("=")[1] if isinstance(value, list) else None)
def test_a_strategy_that_cannot_run_is_refused_in_one_line_before_work_starts(
        strategy, code, says, mnist_dir, in_tmp, capsys):
    assert run_train(fit_args(mnist_dir, "--trainer.devices=2", "--trainer.max_steps=3",
                              *strategy)) == code
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("train.py: error: ") and says in last
    assert not any(run.joinpath("checkpoints").exists() for run in runs(in_tmp))


@pytest.mark.slow
def test_ddp_finding_unused_parameters_trains_two_processes(mnist_dir, in_tmp):
    done = run_process(fit_args(mnist_dir, "--trainer.devices=2", "--trainer.max_steps=3",
                                "--trainer.strategy=ddp_find_unused_parameters_true"),
                       cwd=in_tmp, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "ImageClassifier(mlp) on mnist: test/acc" in done.stdout


# --- a spawned or forked fit from Python ----------------------------------------------------------

def forked_fit(mnist_dir, tmp_path, model: ImageClassifier, built: bool) -> ImageClassifier:
    """Fit `model` in two forked processes (Lightning's ddp_fork), from this one."""
    data = MNISTDataModule(str(mnist_dir), batch_size=32)
    if built:
        model.take_from_data(data)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(model, datamodule=data)
    return model


@pytest.mark.slow
def test_a_forked_fit_gives_its_weights_back_to_a_model_built_before_it(mnist_dir, tmp_path):
    L.seed_everything(0, verbose=False)
    model = ImageClassifier("mlp", lr=0.01)
    model.take_from_data(MNISTDataModule(str(mnist_dir)))
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    forked_fit(mnist_dir, tmp_path, model, built=True)
    assert any(not torch.equal(before[k], v) for k, v in model.net.state_dict().items())


@pytest.mark.slow
def test_a_forked_fit_of_a_model_not_built_yet_is_refused_before_it_trains(mnist_dir, tmp_path):
    # Lightning loads the weights back with strict=False: a model without its network would drop
    # them all, and a test after it would build an untrained one.
    with pytest.raises(Exception, match="take_from_data") as refused:
        forked_fit(mnist_dir, tmp_path, ImageClassifier("mlp", lr=0.01), built=False)
    assert "ModelError" in str(refused.value)


# --- the LightningModule's exports ----------------------------------------------------------------

@pytest.fixture(scope="module", params=[("mlp", False), ("cnn", True)], ids=["mlp", "cnn-flip"])
def trained(request, tmp_path_factory):
    """An ImageClassifier trained a few steps from Python with Lightning's Trainer (the CNN
    averaging each image's logits with its mirror image's); test images."""
    from conftest import write_mnist

    folder = tmp_path_factory.mktemp("export")
    data = MNISTDataModule(str(write_mnist(folder / "data")), batch_size=32)
    L.seed_everything(0, verbose=False)
    net, flip_test = request.param
    model = ImageClassifier(net, lr=0.01, flip_test=flip_test)
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(folder))
    trainer.fit(model, datamodule=data)
    return model.eval(), data.read("test")[0][:8], folder


def expected(model, images) -> np.ndarray:
    with torch.no_grad():
        return model(images).numpy()


@pytest.mark.parametrize("dynamic", [False, True])
def test_to_onnx_writes_what_the_model_computes(dynamic, trained):
    import onnxruntime

    model, images, folder = trained
    path = folder / f"model-{dynamic}.onnx"
    if dynamic:  # any batch size, as torch.onnx.export takes it
        model.to_onnx(path, images[:2], dynamic_shapes=({0: torch.export.Dim("batch")},))
    else:  # the model's example_input_array, one image
        model.to_onnx(path)
        images = images[:1]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
    np.testing.assert_allclose(got, expected(model, images), atol=1e-5)


@pytest.mark.parametrize("method", ["script", "trace"])
def test_to_torchscript_saves_what_the_model_computes(method, trained):
    model, images, folder = trained
    path = folder / f"model-{method}.pt"
    model.to_torchscript(path, method=method)
    loaded = torch.jit.load(str(path))
    np.testing.assert_allclose(loaded(images).detach().numpy(), expected(model, images),
                               atol=1e-5)
