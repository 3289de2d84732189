"""Every path Lightning documents for a CPU works or is refused in one line before work starts:
the strategies for two CPU processes, each combination of `deterministic` and `benchmark`, and the
LightningModule's own exports (`to_onnx`, `to_torchscript`) of a model trained from Python.
"""

import itertools

import lightning as L
import pytest
import torch
from conftest import run_train

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

