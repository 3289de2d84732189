"""A stop in each phase of each command (lit_models/callbacks.py LastCheckpoint, the one place that
handles signals while a stage runs): SIGTERM ends with exit code 143, Ctrl-C with 130, and one line
that says where it stopped; no traceback, no half-written file, never a success. The same callbacks
stop a fit from Python.

Each cell sends this process the signal from inside its phase (a probe at a batch, or a function of
the phase that sends it as it is called). SIGTERM is sent only while a Trainer stage runs: outside
one it is Python's default, which would end pytest (tests/test_reliability.py and test_ddp.py stop
real processes)."""

import os
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import ROOT, run_train, runs, write_mnist
from probes import SignalAt

from datamodules import MNISTDataModule
from lit_cli import command_line
from lit_models import ImageClassifier, LastCheckpoint, RunRecord

TESTS = str(ROOT / "tests")
SAID = {"SIGTERM": ("SIGTERM", 143), "SIGINT": ("Ctrl-C", 130)}
FIT = ["--model", "mlp", "--data.batch_size", "64", "--data.eval_batch_size", "20",
       "--trainer.max_epochs", "1"]  # 8 steps, 4 validation and 10 test batches

pytestmark = pytest.mark.slow  # a fit or more each: seconds


def at_call(patch, owner, name: str, signal_name: str) -> None:
    """Patches owner.name to send this process the signal as it is first called."""
    original, sent = getattr(owner, name), []

    def sending(*args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), getattr(signal, signal_name))
        return original(*args, **kwargs)

    patch.setattr(owner, name, sending)


def at_batch(stage: str, batch: int, signal_name: str) -> list[str]:
    """Options that send this process the signal as batch `batch` of `stage` starts (-1: its
    last)."""
    return ["--trainer.callbacks+=probes.SignalAtBatch", f"--trainer.callbacks.stage={stage}",
            f"--trainer.callbacks.batch={batch}", f"--trainer.callbacks.signal_name={signal_name}"]


def stopped(args: list[str], cwd: Path, capsys, patched=None) -> tuple[int, str]:
    """train.py's exit code for `args` in `cwd` (with `patched(patch)` applied), and its last line
    on stderr, which a traceback may not precede."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.syspath_prepend(TESTS)
        if patched is not None:
            patched(patch)
        code = run_train(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return code, err.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The tiny MNIST, written once for the module."""
    return write_mnist(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """A finished run, for the use commands: its folder."""
    cwd = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert run_train([*FIT, "--data.data_dir", str(data)]) == 0
    return runs(cwd)[0]


def written(folder: Path) -> set[Path]:
    """Every file below `folder`."""
    return {p for p in folder.rglob("*") if p.is_file()}


USES = [  # the command, the stage its probe waits for, the signal, the batch (-1: the last)
    ("test", "test", "SIGTERM", 0),
    ("test", "test", "SIGINT", -1),
    ("validate", "validation", "SIGTERM", -1),  # Lightning's loop runs through it: stopped after
    ("validate", "validation", "SIGINT", 0),
    ("predict", "predict", "SIGTERM", 0),
    ("predict", "predict", "SIGINT", -1),
]


@pytest.mark.parametrize("command, stage, signal_name, batch", USES)
def test_a_stop_while_a_use_command_runs_ends_in_one_line_with_no_file_half_written(
        command, stage, signal_name, batch, data, trained, tmp_path, capsys):
    before = written(trained.parent)
    args = [command, "--ckpt_path", str(trained), "--data.data_dir", str(data),
            "--data.eval_batch_size", "20", *at_batch(stage, batch, signal_name)]
    code, line = stopped(args, tmp_path, capsys)
    by, expected = SAID[signal_name]
    doing = {"test": "testing", "validate": "validating", "predict": "predicting"}[command]
    assert (code, line) == (expected, f"train.py: stopped by {by} while {doing}; what it wrote "
                                      f"before is whole")
    new = written(trained.parent) - before
    # A test or validation logs in the run's <command>/ folder, and its record says it stopped;
    # a prediction writes no file at all.
    assert not [p for p in new if f"/{command}/" not in str(p) or ".tmp" in p.name]
    records = [p for p in new if p.name == "results.json"]
    assert len(records) == (command != "predict")
    assert all(f'"status": "stopped by {by}"' in p.read_text() for p in records)


def test_ctrl_c_while_exporting_ends_in_one_line_and_writes_nothing(trained, tmp_path, capsys):
    import lit_models.export

    output = tmp_path / "model.pt"
    code, line = stopped(
        ["export", "--ckpt_path", str(trained), "--format", "torchscript", "--output",
         str(output)], tmp_path, capsys,
        # once the file is written, before it takes its name
        lambda patch: at_call(patch, lit_models.export, "check", "SIGINT"))
    assert code == 130 and line.startswith("train.py: stopped by Ctrl-C while exporting")
    assert written(tmp_path) == set()


def test_ctrl_c_before_the_command_starts_ends_in_one_line(data, tmp_path, capsys):
    code, line = stopped([*FIT, "--data.data_dir", str(data)], tmp_path, capsys,
                         lambda patch: at_call(patch, command_line, "expand", "SIGINT"))
    assert (code, line) == (130, "train.py: stopped by Ctrl-C before the command started; "
                                 "nothing was written")
    assert written(tmp_path) == set()


def test_ctrl_c_while_the_fit_reads_its_data_ends_in_one_line(data, tmp_path, capsys):
    """In the Trainer's setup, before the loop: Lightning ends a Ctrl-C there with exit(1), and
    LastCheckpoint says it was Ctrl-C."""
    code, line = stopped([*FIT, "--data.data_dir", str(data)], tmp_path, capsys,
                         lambda patch: at_call(patch, MNISTDataModule, "read", "SIGINT"))
    assert (code, line) == (130, "train.py: stopped by Ctrl-C in epoch 0; no checkpoint was "
                                 "written")
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("results.json"))


def test_ctrl_c_while_an_image_folder_is_decoded_leaves_no_part_of_its_cache(tmp_path, capsys):
    """Decoded into its cache as train.py builds the model (which takes the image shape from the
    data), before the Trainer starts."""
    from test_image_folder import write_folder

    import datamodules.image_folder

    folder = write_folder(tmp_path / "images", size=8)
    args = ["--model", "mlp", "--data", "ImageFolderDataModule", "--data.root", str(folder),
            "--data.data_dir", str(tmp_path / "data"), "--trainer.max_epochs", "1",
            "--data.batch_size", "32"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        at_call(patch, datamodules.image_folder, "decode_files", "SIGINT")
        # Python's own Ctrl-C, as a command has it: an xdist worker may have it ignored.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code = run_train(args)
        finally:
            signal.signal(signal.SIGINT, previous)
    assert not list((tmp_path / "data").rglob("*.npy*")) and not list(tmp_path.rglob("*.ckpt"))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert (code, line) == (130, "train.py: stopped by Ctrl-C before the command started; "
                                 "nothing was written")


def python_fit(root: Path, data: Path, *callbacks, ckpt_path=None) -> L.Trainer:
    """A fit from Python with Lightning's Trainer and the project's run-safety callbacks."""
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_epochs=2, default_root_dir=str(root), enable_progress_bar=False,
                        enable_model_summary=False,
                        callbacks=[LastCheckpoint(), RunRecord(), *callbacks])
    trainer.fit(ImageClassifier("mlp"), MNISTDataModule(str(data), batch_size=64),
                ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("signal_name", SAID)
def test_from_python_a_signal_stops_after_the_step_and_the_fit_goes_on_as_an_unbroken_one(
        signal_name, data, tmp_path):
    """The same callbacks on a plain Trainer: SIGTERM, or a first Ctrl-C, stops after the step with
    last.ckpt and the run's record, as train.py does."""
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException
        python_fit(tmp_path / "stopped", data, SignalAt(5, signal_name))
    (run,) = runs(tmp_path / "stopped")
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 5
    said = f'"status": "stopped by {SAID[signal_name][0]}"'
    assert said in (run / "results.json").read_text()
    resumed = python_fit(tmp_path / "stopped", data, ckpt_path=str(last))
    straight = python_fit(tmp_path / "unbroken", data)
    assert resumed.global_step == straight.global_step == 16
    mine, theirs = (t.lightning_module.state_dict() for t in (resumed, straight))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    # Lightning's logger puts the fit that goes on in a new folder, with its own record.
    assert '"status": "finished"' in (runs(tmp_path / "stopped")[-1] / "results.json").read_text()
