"""Run safety (lit_models/callbacks.py: LastCheckpoint, RunRecord; datamodules/files.py): a signal
stops a fit after its step with last.ckpt, and the fit goes on from it to the weights of an
unbroken one; a fit that fails keeps its folder and says why; files are written whole.

A probe (tests/probes.py) sends this process a real signal at the moment a test names, while a
Trainer stage runs (Lightning's handler is in place then; outside a stage SIGTERM is Python's
default, which would end pytest)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import PROBES, ROOT, results, run_process, run_train, runs, scalars, write_mnist

import train
from datamodules.files import WholeCheckpointIO, written_whole

TESTS = str(ROOT / "tests")
# 8 steps an epoch (540 training images in batches of 64), 16 in all.
BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "2"]
SAID = {"SIGTERM": ("SIGTERM", 143), "SIGINT": ("Ctrl-C", 130)}

pytestmark = pytest.mark.slow  # a fit or more each: seconds


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The tiny MNIST, written once for the module."""
    return write_mnist(tmp_path_factory.mktemp("data"))


def in_folder(cwd: Path, args: list[str]) -> int:
    """train.py's exit code for `args`, run in this process in `cwd`, with tests/ importable (the
    probes)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.syspath_prepend(TESTS)
        return run_train(args)


def probe(step: int, signal_name: str = "SIGTERM") -> list[str]:
    """Options that send this process the signal after optimizer step `step` (probes.SignalAt)."""
    return ["--trainer.callbacks+=probes.SignalAt", f"--trainer.callbacks.step={step}",
            f"--trainer.callbacks.signal_name={signal_name}"]


def weights(run: Path) -> dict:
    """The weights in a run's last.ckpt."""
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def last_line(capsys) -> tuple[str, str]:
    """What this test wrote to stderr so far, and its last line."""
    err = capsys.readouterr().err
    return err, err.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def unbroken(data, tmp_path_factory):
    """The runs to compare with: each variant (extra options) fitted straight through, once."""
    cache = {}

    def get(extra: tuple) -> Path:
        if extra not in cache:
            cwd = tmp_path_factory.mktemp("unbroken")
            assert in_folder(cwd, [*BASE, "--data.data_dir", str(data), *extra]) == 0
            cache[extra] = runs(cwd)[0]
        return cache[extra]

    return get


def ends_as(run: Path, straight: Path) -> None:
    """Asserts that the fit of `run` ended as `straight` did: its steps, metrics and weights."""
    mine, theirs = results(run), results(straight)
    assert mine["status"] == "finished" and mine["global_step"] == theirs["global_step"]
    for key in ("val/loss", "val/acc_best", "test/loss", "test/acc"):
        assert mine["metrics"][key] == theirs["metrics"][key], key
    ours, straights = weights(run), weights(straight)
    assert ours.keys() == straights.keys()
    assert all(torch.equal(ours[k], straights[k]) for k in straights)


STOPS = [  # the signal, the probe's step (-2: as a validation starts), the step it stops after
    ("SIGTERM", 5, 5, ()),  # mid-epoch
    ("SIGINT", 8, 8, ()),  # Ctrl-C at an epoch's last batch, before its validation
    ("SIGTERM", -2, 8, ()),  # in the validation after epoch 0
    ("SIGTERM", 4, 4, ("--trainer.accumulate_grad_batches", "3")),  # 3 steps an epoch
    ("SIGINT", 13, 13, ("--trainer.val_check_interval", "0.5")),  # after a mid-epoch validation
]


@pytest.mark.parametrize("signal_name, at, step, extra", STOPS)
def test_a_signal_stops_after_the_step_and_the_fit_goes_on_as_an_unbroken_one(
        signal_name, at, step, extra, data, unbroken, tmp_path, capsys):
    args = [*BASE, "--data.data_dir", str(data), *extra]
    assert in_folder(tmp_path, args + probe(at, signal_name)) == SAID[signal_name][1]
    err, line = last_line(capsys)
    (run,) = runs(tmp_path)
    saved = run / "checkpoints" / "last.ckpt"
    said = re.fullmatch(rf"train\.py: stopped by {SAID[signal_name][0]} in epoch (\d+) at step "
                        rf"{step}; saved {saved}: add --ckpt_path {saved} to the same command to "
                        rf"go on", line)
    assert said and "Traceback" not in err, err[-2000:]
    checkpoint = torch.load(saved, weights_only=True)
    assert checkpoint["global_step"] == step and checkpoint["epoch"] == int(said[1])
    assert results(run)["status"] == f"stopped by {SAID[signal_name][0]}"
    # The command the line gives: the same one, with --ckpt_path.
    assert in_folder(tmp_path, args + ["--ckpt_path", str(saved)]) == 0
    assert runs(tmp_path) == [run]  # it went on in its own folder
    ends_as(run, unbroken(extra))
    assert results(run)["ckpt_path"] == str(saved)
    assert (run / "config.yaml").is_file() and (run / "config-resumed.yaml").is_file()
    if not extra:  # the steps before the stop count in their epoch's mean
        assert scalars(run)["train/loss_epoch"] == pytest.approx(
            scalars(unbroken(()))["train/loss_epoch"], rel=1e-6)


def test_augmented_cifar10_goes_on_exactly(cifar10_dir, tmp_path):
    """Random crops and flips drawn again after the stop as they were drawn in the unbroken run
    (6 batches an epoch: Lightning's limit)."""
    args = ["--model", "cnn", "--data.data_dir", str(cifar10_dir), "--data.batch_size", "32",
            "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "6",
            "--trainer.limit_val_batches", "1"]
    for folder in ("stopped", "unbroken"):
        (tmp_path / folder).mkdir()
    assert in_folder(tmp_path / "stopped", args + probe(4)) == 143
    assert in_folder(tmp_path / "stopped", args + ["--ckpt_path", "last"]) == 0
    assert in_folder(tmp_path / "unbroken", args) == 0
    ends_as(runs(tmp_path / "stopped")[0], runs(tmp_path / "unbroken")[0])


# The test's last batch (one batch of 1000: Lightning's loop runs through a SIGTERM there), or an
# earlier one.
@pytest.mark.parametrize("eval_batch_size", ["20", "1000"])
def test_a_sigterm_while_the_fit_tests_keeps_the_fits_record_and_says_so(
        eval_batch_size, data, tmp_path, capsys):
    args = [*BASE, "--data.data_dir", str(data), "--data.eval_batch_size", eval_batch_size]
    assert in_folder(tmp_path, args + probe(-1)) == 143
    err, line = last_line(capsys)
    assert line == "train.py: stopped by SIGTERM while testing; what it wrote before is whole"
    assert "Traceback" not in err
    (run,) = runs(tmp_path)
    record = results(run)
    assert record["stage"] == "fit" and record["status"] == "stopped by SIGTERM"
    assert record["epochs"] == 2 and record["global_step"] == 16
    assert record["metrics"]["val/acc_best"] is not None
    assert torch.load(record["best_model_path"], weights_only=True)["global_step"] > 0  # whole


def test_a_sigterm_after_the_last_step_stops_before_the_test_and_going_on_tests(
        data, unbroken, tmp_path, capsys):
    """Lightning's loop ends quietly after its last step: the command stops, not as a success."""
    args = [*BASE, "--data.data_dir", str(data)]
    assert in_folder(tmp_path, args + probe(-4)) == 143
    err, line = last_line(capsys)
    (run,) = runs(tmp_path)
    saved = run / "checkpoints" / "last.ckpt"
    assert line == (f"train.py: stopped by SIGTERM in epoch 2 at step 16; saved {saved}: add "
                    f"--ckpt_path {saved} to the same command to go on")
    record = results(run)
    assert record["status"] == "stopped by SIGTERM" and "test/acc" not in record["metrics"]
    assert in_folder(tmp_path, args + ["--ckpt_path", str(saved)]) == 0
    ends_as(run, unbroken(()))


# --- a fit that fails keeps its folder (defect 4) -----------------------------------------------

BOOM = '''
from lit_models import ImageClassifier


class Boom(ImageClassifier):
    """Raises, or turns its loss to NaN, where `at` says."""

    def __init__(self, at: str = "step", **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def setup(self, stage):
        super().setup(stage)
        if self.at == "setup":
            raise ValueError("boom in setup")

    def training_step(self, batch, batch_idx):
        if self.at == "step" and self.global_step == 3:
            raise RuntimeError("boom at step 3")
        loss = super().training_step(batch, batch_idx)
        if self.at == "nan" and self.global_step == 10:  # in epoch 1, after epoch 0's checkpoints
            return loss * float("nan")
        return loss

    def validation_step(self, batch, batch_idx):
        if self.at == "validation" and not self.trainer.sanity_checking:
            raise RuntimeError("boom in validation")
        return super().validation_step(batch, batch_idx)
'''

DIVERGED = "the weights became NaN or infinite in epoch {}"
FAILED = [  # options, the last line says, the record's status starts (None: no record), a bug
    (["--model.optimizer", "SGD", "--model.optimizer.lr", "1e6"],
     "no checkpoint holds them. Try a lower learning rate (--model.optimizer.lr)",
     "failed: ModelError: " + DIVERGED.format(0), False),
    (["--model.optimizer.lr", "1e6"], DIVERGED.format(0), "failed: ModelError", False),  # AdamW
    (["--model", "boom.Boom", "--model.at", "nan"], DIVERGED.format(1), "failed: ModelError",
     False),
    (["--model", "boom.Boom"], "RuntimeError: boom at step 3",
     "failed: RuntimeError: boom at step 3", True),
    (["--model", "boom.Boom", "--model.at", "validation"], "RuntimeError: boom in validation",
     "failed: RuntimeError: boom in validation", True),
    # The Trainer started, its loop did not: the folder stays, with no record.
    (["--model", "boom.Boom", "--model.at", "setup"], "ValueError: boom in setup", None, True),
    (["--model.scheduler.warmup", "1.5"], "--model.scheduler.warmup must be between 0 and 1",
     None, False),  # refused as the optimizers are made
]


@pytest.mark.parametrize("options, said, status, bug", FAILED,
                         ids=["SGD", "AdamW", "NaN in epoch 1", "raises", "in validation",
                              "in setup", "a schedule refused"])
def test_a_fit_that_diverges_or_raises_keeps_its_folder_events_and_config(
        options, said, status, bug, data, own_modules, in_tmp, capsys):
    """Defect 4: such a fit had its run folder taken back, with the TensorBoard events to debug
    it. Now it exits 1 (one line; a module's own error with its traceback), its folder kept, and
    no checkpoint holds NaN weights."""
    (own_modules / "boom.py").write_text(BOOM)
    args = ["--model", "mlp", *options, "--data.data_dir", str(data), *BASE[2:]]
    assert run_train(args) == 1
    err, line = last_line(capsys)
    assert said in line and ("Traceback" in err) == bug, err[-2000:]
    (run,) = runs(in_tmp)
    assert (run / "config.yaml").is_file() and list(run.glob("events.out.tfevents.*"))
    if status is None:
        assert not (run / "results.json").exists()
    else:
        text = (run / "results.json").read_text()
        # Valid JSON: NaN as null.
        record = json.loads(text, parse_constant=lambda nan: pytest.fail(f"{nan} in {text}"))
        assert record["status"].startswith(status) and record["stage"] == "fit"
        if said.startswith("the weights became NaN"):
            assert record["metrics"]["val/loss"] is None
    for checkpoint in in_tmp.rglob("*.ckpt"):  # epoch 0's, where epoch 1 diverged
        state = torch.load(checkpoint, weights_only=True)["state_dict"]
        assert all(v.isfinite().all() for v in state.values() if v.is_floating_point())
    assert bool(list(in_tmp.rglob("*.ckpt"))) == (status is not None and "epoch 1" in said)


@pytest.mark.parametrize("args, code, said", [
    (["--data.batch_size", "0"], 1, "--data.batch_size 0"),
    (["--trainer.max_epochs", "abc"], 2, 'Parser key "trainer.max_epochs"'),
    (["--trainer.enable_progress_bar", "false", "--trainer.callbacks+=TQDMProgressBar"], 2,
     "enable_progress_bar=False"),
    (["--data.data_dir", "nothing"], 1, "MNIST is not in"),  # none offline: prepare_data's
    # Lightning's own refusal of a seed is a traceback.
    (["--seed_everything", "-1"], 2, "--seed_everything -1: a seed from 0 to 4294967295"),
    (["--seed_everything", "4294967296"], 2, "--seed_everything 4294967296: a seed from 0"),
])
def test_a_command_that_fails_before_the_trainer_starts_leaves_nothing(args, code, said, data,
                                                                      in_tmp, capsys):
    assert run_train([*BASE, "--data.data_dir", str(data), *args], quiet=False) == code
    err, line = last_line(capsys)
    assert line.startswith("train.py: error: ") and said in line and "Traceback" not in err
    assert not (in_tmp / "lightning_logs").exists()


def test_a_callback_whose_package_is_missing_says_lightnings_install_line(data, in_tmp,
                                                                         monkeypatch, capsys):
    """Lightning's own ModuleNotFoundError (no module name in it) is its one line, exit 1."""
    from lightning.pytorch.callbacks.progress import rich_progress

    monkeypatch.setattr(rich_progress, "_RICH_AVAILABLE", False)
    args = [*BASE, "--data.data_dir", str(data), "--trainer.callbacks+=RichProgressBar"]
    assert run_train(args) == 1
    err, line = last_line(capsys)
    assert line == ("train.py: error: `RichProgressBar` requires `rich` >= 10.2.2. Install it by "
                    "running `pip install -U rich`."), err[-2000:]
    assert "Traceback" not in err and not (in_tmp / "lightning_logs").exists()


def test_many_epochs_with_the_default_logger_do_not_grow_memory(data, tmp_path):
    """An earlier version grew by 0.16 MB an epoch with TensorBoard (not in the Python heap): 20 MB
    over these. A process of its own: this one's memory holds other tests'."""
    proc = run_process([*BASE, "--data.data_dir", str(data), "--trainer.max_epochs", "150",
                        "--trainer.limit_train_batches", "1",
                        "--trainer.callbacks+=probes.MemoryGrowth"],
                       cwd=tmp_path, env=PROBES)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(scalars(runs(tmp_path)[0])["val/acc"]) == 150  # TensorBoard got every epoch
    assert float((tmp_path / "memory.txt").read_text()) < 8


# --- files written whole ------------------------------------------------------------------------

def test_a_full_disk_stops_in_one_line_and_the_checkpoints_before_stay_whole(data, tmp_path,
                                                                           capsys):
    """probes.FullDisk: a checkpoint IO of the user's (kept as given) whose disk fills up after
    epoch 0's two checkpoints."""
    assert in_folder(tmp_path, [*BASE, "--data.data_dir", str(data),
                                "--trainer.plugins=probes.FullDisk"]) == 1
    err, line = last_line(capsys)
    (run,) = runs(tmp_path)
    assert line == (f"train.py: error: No space left on device: "
                    f"{run / 'checkpoints' / 'last.ckpt'}") and "Traceback" not in err
    checkpoints = list((run / "checkpoints").glob("*.ckpt"))
    assert len(checkpoints) == 2
    assert all(torch.load(c, weights_only=True)["epoch"] == 0 for c in checkpoints)
    assert results(run)["status"].startswith("failed: OSError")


@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 1 MiB (tmpfs), where the machine lets this process mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small file system needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_really_full_disk_is_named_and_left_with_no_part_of_a_checkpoint(small_disk, data,
                                                                           in_tmp, capsys):
    # The first checkpoint (1.2 MB with AdamW's state) does not fit.
    assert run_train([*BASE, "--data.data_dir", str(data),
                      "--trainer.default_root_dir", str(small_disk)]) == 1
    err, line = last_line(capsys)
    checkpoints = small_disk / "lightning_logs" / "version_0" / "checkpoints"
    assert line.startswith(f"train.py: error: No space left on device: {checkpoints}/"), err[-2000:]
    assert not [p for p in small_disk.rglob("*") if p.is_file() and ".ckpt" in p.name]


def test_files_are_written_whole_or_not_at_all(tmp_path):
    target = tmp_path / "record.json"
    target.write_text("old")
    with pytest.raises(ValueError), written_whole(target) as tmp:
        tmp.write_text("half")
        raise ValueError
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["record.json"]
    with written_whole(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["record.json"]
    with pytest.raises(IsADirectoryError, match=f"a folder, not a file: '{tmp_path}'"):
        with written_whole(tmp_path):
            pass


def test_checkpoints_are_written_whole_unless_the_user_gives_a_checkpoint_io(data, in_tmp):
    from lightning.pytorch.plugins import AsyncCheckpointIO

    for plugins, kind in (([], WholeCheckpointIO),
                          (["--trainer.plugins=AsyncCheckpointIO"], AsyncCheckpointIO)):
        cli = train.TrainCLI([*BASE, "--data.data_dir", str(data), *plugins], run=False)
        assert type(cli.trainer.strategy.checkpoint_io) is kind


# --- checkpoints that cannot go on ----------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """A finished run (the module's tests that change it take a copy): its folder."""
    cwd = tmp_path_factory.mktemp("trained")
    assert in_folder(cwd, [*BASE, "--data.data_dir", str(data)]) == 0
    return runs(cwd)[0]


def test_going_on_from_a_finished_run_trains_nothing_and_tests_it_again(trained, tmp_path):
    run = tmp_path / "lightning_logs" / "version_0"
    shutil.copytree(trained, run)
    before, record = weights(run), results(run)
    assert in_folder(tmp_path, ["--ckpt_path", str(run / "checkpoints" / "last.ckpt")]) == 0
    assert runs(tmp_path) == [run]
    after = results(run)
    assert after["global_step"] == record["global_step"] and after["status"] == "finished"
    assert after["metrics"]["test/loss"] == record["metrics"]["test/loss"]
    assert all(torch.equal(before[k], v) for k, v in weights(run).items())


def test_a_weights_only_checkpoint_cannot_go_on_in_one_line(trained, tmp_path, capsys):
    checkpoint = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    alone = {k: v for k, v in checkpoint.items()
             if k not in ("optimizer_states", "lr_schedulers", "loops")}
    torch.save(alone, tmp_path / "weights.ckpt")
    assert in_folder(tmp_path, ["--ckpt_path", str(tmp_path / "weights.ckpt")]) == 2
    err, line = last_line(capsys)
    assert line == (f"train.py: error: {tmp_path / 'weights.ckpt'} holds weights alone, no "
                    f"optimizer state to go on from: test, predict or export it, or start a new "
                    f"run") and "Traceback" not in err
    assert not (tmp_path / "lightning_logs").exists()


def test_going_on_from_a_checkpoint_missing_a_weight_names_it_in_one_line(trained, tmp_path,
                                                                         capsys):
    run = tmp_path / "lightning_logs" / "version_0"
    shutil.copytree(trained, run)
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    del checkpoint["state_dict"]["net.fc2.bias"]
    torch.save(checkpoint, run / "checkpoints" / "last.ckpt")
    record = (run / "results.json").read_text()
    assert in_folder(tmp_path, ["--ckpt_path", str(run / "checkpoints" / "last.ckpt")]) == 1
    err, line = last_line(capsys)
    assert line.startswith("train.py: error: ") and "net.fc2.bias" in line, line
    assert "Traceback" not in err and runs(tmp_path) == [run]
    assert "net.fc2.bias" not in weights(run) and (run / "results.json").read_text() == record


def test_a_mid_epoch_checkpoint_without_the_data_position_is_refused(data, tmp_path, capsys):
    """A checkpoint without the data module's position in the epoch (an earlier version's, or a
    fit's on other data): going on would train some batches twice."""
    args = [*BASE, "--data.data_dir", str(data)]
    assert in_folder(tmp_path, args + probe(5)) == 143
    last = runs(tmp_path)[0] / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint.pop("MNISTDataModule")["train_batches"] == {"epoch": 0, "batches": 5}
    torch.save(checkpoint, last)
    capsys.readouterr()
    assert in_folder(tmp_path, args + ["--ckpt_path", "last"]) == 1
    err, line = last_line(capsys)
    assert line.startswith(f"train.py: error: {last} holds no position in the batches of "
                           f"MNISTDataModule") and "Traceback" not in err
    assert torch.load(last, weights_only=True)["global_step"] == 5  # left as it was


def test_a_damaged_checkpoint_or_one_without_a_usable_std_is_refused_in_one_line(
        trained, tmp_path, capsys):
    """Bytes flipped inside the weights (the zip still opens: its checksums say it); a std of 0,
    which no normalisation divides by. (tests/test_use.py: truncated, NaN, other shapes.)"""
    good = trained / "checkpoints" / "last.ckpt"
    flipped = bytearray(good.read_bytes())
    flipped[len(flipped) // 2:len(flipped) // 2 + 64] = bytes(64)
    (tmp_path / "flipped.ckpt").write_bytes(flipped)
    contents = torch.load(good, weights_only=True)
    contents["hyper_parameters"]["std"] = [0.0]
    torch.save(contents, tmp_path / "zero_std.ckpt")
    for name, command, said in (
            ("flipped", ["test"], "cannot be read (archive/data/"),
            ("zero_std", ["export", "--output", str(tmp_path / "m.onnx")], "and std > 0")):
        checkpoint = str(tmp_path / f"{name}.ckpt")
        assert in_folder(tmp_path, [command[0], "--ckpt_path", checkpoint, *command[1:]]) == 1
        err, line = last_line(capsys)
        assert line.startswith("train.py: error: ") and said in line and "Traceback" not in err
    assert not list(tmp_path.glob("*.onnx")) and not (tmp_path / "lightning_logs").exists()


def test_bf16_true_keeps_the_best_validation_accuracy_exactly(data, in_tmp):
    # A learning rate low enough that the accuracy still grows over the epochs.
    assert run_train([*BASE, "--data.data_dir", str(data), "--trainer.precision", "bf16-true",
                      "--trainer.max_epochs", "3", "--model.optimizer.lr", "0.0002"]) == 0
    logged = scalars(runs(in_tmp)[0])
    assert logged["val/acc"][0] < max(logged["val/acc"]) < 1
    assert logged["val/acc_best"] == [max(logged["val/acc"][:i + 1]) for i in range(3)]


@pytest.fixture(scope="module")
def swa_run(data, tmp_path_factory) -> Path:
    """A fit with StochasticWeightAveraging from the command line, which copies the model in its
    setup (train.py builds the network from the data before): its folder."""
    cwd = tmp_path_factory.mktemp("swa")
    assert in_folder(cwd, [*BASE, "--data.data_dir", str(data),
                           "--trainer.callbacks+=StochasticWeightAveraging",
                           "--trainer.callbacks.swa_lrs=0.01",
                           "--trainer.callbacks.swa_epoch_start=1"]) == 0
    return runs(cwd)[0]


def test_a_fit_with_swa_from_the_command_line_predicts(swa_run, tmp_path):
    assert in_folder(tmp_path, ["predict", "--ckpt_path", str(swa_run)]) == 0
    assert len(list(swa_run.glob("*.csv"))) == 1


def test_the_config_of_a_fit_with_swa_runs_it_again(swa_run, tmp_path):
    assert in_folder(tmp_path, ["--config", str(swa_run / "config.yaml")]) == 0
    again = results(runs(tmp_path)[0])
    assert again["metrics"]["test/loss"] == results(swa_run)["metrics"]["test/loss"]


def test_a_run_folder_another_run_holds_is_refused_and_left_as_it_was(data, tmp_path, capsys):
    """Lightning's loggers pick the next free version without a lock (#11418): a second run in
    a folder another run holds (here, named by hand) is refused in one line, the first run's files
    as they were."""
    args = [*BASE, "--data.data_dir", str(data), "--trainer.max_epochs", "1"]
    assert in_folder(tmp_path, args) == 0
    (run,) = runs(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    logger = ["--trainer.logger", "TensorBoardLogger", "--trainer.logger.save_dir", ".",
              "--trainer.logger.version", run.name]
    assert in_folder(tmp_path, [*args, *logger]) == 2
    assert last_line(capsys)[1] == (f"train.py: error: lightning_logs/{run.name}/config.yaml "
                                    f"exists: the logger's run folder holds another run; give the "
                                    f"logger a version of its own, or leave it to pick one")
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert {p: after[p] for p in before} == before
    # Lightning opens the loggers' writers before any callback's setup: an events file, empty
    assert all(p.name.startswith("events.out.tfevents.") for p in after.keys() - before.keys())
