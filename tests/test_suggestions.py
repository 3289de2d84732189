"""Every message that suggests a command suggests one that works (issue 48): each case makes the
message, takes the command it suggests, and runs it. (The finished run's two suggestions:
tests/test_resume_changes.py; the stop's `--ckpt_path` to go on: tests/test_reliability.py.)"""

import re
import shutil
import textwrap

import pytest
import torch
from conftest import results, run_train, runs
from test_own_code import LIT_MODEL

pytestmark = pytest.mark.slow  # each test trains for seconds

SHORT = ["--trainer.max_epochs", "1", "--data.batch_size", "64"]


def last_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.fixture
def mnist(mnist_dir, in_tmp):
    return ["--model", "mlp", "--data.data_dir", str(mnist_dir), *SHORT]


def test_one_learning_rate_suggests_model_lr_and_null(mnist, capsys):
    assert run_train([*mnist, "--model.optimizer.lr", "0.01"]) == 2
    said = last_line(capsys)
    assert "give --model.lr 0.01, or --model.lr null to use the optimizer's" in said
    assert run_train([*mnist, "--model.lr", "0.01"]) == 0
    assert run_train([*mnist, "--model.lr", "null", "--model.optimizer.lr", "0.01"]) == 0


def test_a_stop_in_the_test_after_a_fit_suggests_a_test_that_runs(mnist, capsys):
    stop = ["--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=-1"]
    assert run_train([*mnist, *stop]) == 143
    test = re.search(r"(train\.py test --ckpt_path \S+) tests it", last_line(capsys))[1]
    assert run_train(test.split()[1:]) == 0
    assert "test/acc" in capsys.readouterr().out


def test_a_model_without_data_is_told_the_option_that_runs_it(mnist, own_modules, capsys):
    (own_modules / "lit_model.py").write_text(textwrap.dedent(LIT_MODEL))
    assert run_train(["--model", "lit_model.LitModel", "--trainer.max_epochs", "1"]) == 2
    said = last_line(capsys)
    assert "has no data: give --data NAME (cifar10, image_folder, mnist, fashion_mnist)" in said
    assert run_train(["--model", "lit_model.LitModel", "--data", "mnist", *mnist[2:]]) == 0


def test_a_damaged_run_config_suggests_moving_it_away(mnist, in_tmp, capsys):
    assert run_train(mnist) == 0
    (run,) = runs(in_tmp)
    (run / "config.yaml").write_text("x: [\n")
    assert run_train(["test", "--ckpt_path", "best"]) == 1
    assert "mend it, or move it away and give --data NAME" in last_line(capsys)
    shutil.move(run / "config.yaml", in_tmp / "config.yaml.damaged")
    assert run_train(["test", "--ckpt_path", "best", "--data", "mnist",
                      *mnist[2:4]]) == 0


def test_validate_without_a_validation_split_suggests_test(mnist, in_tmp, capsys):
    assert run_train([*mnist, "--data.val_size", "0"]) == 0
    assert run_train(["validate", "--ckpt_path", "last"]) == 2
    said = last_line(capsys)
    assert said.endswith("there is no validation set to validate on (--data.val_size 0?): test "
                         "instead")
    assert run_train(["test", "--ckpt_path", "last"]) == 0


def test_a_weights_only_checkpoint_suggests_using_it(mnist, in_tmp, tmp_path, capsys):
    assert run_train(mnist) == 0
    (run,) = runs(in_tmp)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    for key in ("optimizer_states", "lr_schedulers", "loops"):
        del checkpoint[key]
    torch.save(checkpoint, tmp_path / "weights.ckpt")
    assert run_train(["--ckpt_path", str(tmp_path / "weights.ckpt")]) == 1
    assert "test, predict or export it, or start a new run" in last_line(capsys)
    assert run_train(["test", "--ckpt_path", str(tmp_path / "weights.ckpt")]) == 0
    assert results(run)["test/acc"] is not None


def test_a_seed_out_of_range_suggests_true(mnist, capsys):
    assert run_train([*mnist, "--seed_everything", "-1"]) == 2
    assert last_line(capsys).endswith("or true for a random one")
    assert run_train([*mnist, "--seed_everything", "true"]) == 0
