"""A stop at any moment (docs/reliability.md): every command, in every phase, stopped by SIGTERM and
by Ctrl-C, ends with exit code 143 or 130 and one line that says what was saved: no traceback, no
half-written file, never a success; a fit goes on from what it saved to the weights of an unbroken
run.

Each cell sends the signal from inside its phase (a callback at a batch, or a function of the
phase that sends it as it is called), to this process: the stop lands where the test says."""

import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import run_train, runs, write_mnist

import lit_models.export
import lit_models.predict
from datamodules import MNISTDataModule
from lit_cli import command_line, record, signals
from lit_cli import runs as lit_runs

pytestmark = pytest.mark.slow  # a command per cell

SIGNALS = {"SIGTERM": ("SIGTERM", 143), "SIGINT": ("Ctrl-C", 130)}
FIT = ["--model", "mlp", "--data.batch_size", "64", "--data.eval_batch_size", "20",
       "--trainer.max_epochs", "1"]  # 8 steps, 3 validation and 10 test batches
RECORDS = ("results.json", "predictions-*.csv", "*.onnx")


def at_call(owner, name: str, signal_name: str):
    """Patches owner.name to send this process the signal as it is first called."""
    original = getattr(owner, name)
    sent = []

    def sending(*args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), getattr(signal, signal_name))
        return original(*args, **kwargs)

    return lambda patch: patch.setattr(owner, name, sending)


def at_batch(stage: str, batch: int, signal_name: str) -> list[str]:
    """Options that send this process the signal as batch `batch` of `stage` starts."""
    return ["--trainer.callbacks+=probes.SignalAtBatch", f"--trainer.callbacks.stage={stage}",
            f"--trainer.callbacks.batch={batch}", f"--trainer.callbacks.signal_name={signal_name}"]


def phases(command: str, signal_name: str) -> dict:
    """Each phase of a command: (a patch that sends the signal in it, or None; options that do)."""
    stage = {"fit": "train", "validate": "validation"}.get(command, command)
    cells = {"command line": (at_call(command_line, "expand", signal_name), [])}
    if command != "export":
        cells |= {"reading data": (at_call(MNISTDataModule, "read", signal_name), []),
                  "first batch": (None, at_batch(stage, 0, signal_name)),
                  "middle": (None, at_batch(stage, 1, signal_name)),
                  "last batch": (None, at_batch(stage, -1, signal_name))}
    if command == "fit":
        cells |= {"validating": (None, at_batch("validation", 1, signal_name)),
                  "testing after the fit": (None, at_batch("test", 1, signal_name))}
    if command != "fit":
        cells["reading the checkpoint"] = (at_call(lit_runs, "read_checkpoint", signal_name), [])
    if command in ("fit", "test", "validate"):
        cells["writing records"] = (at_call(record, "write", signal_name), [])
    if command == "predict":  # the CSV file is whole: the stop comes after it
        cells["after writing"] = (at_call(lit_models.predict, "show", signal_name), [])
    if command == "export":
        cells |= {"reading data": (at_call(lit_models.export, "checking_images", signal_name), []),
                  "writing": (at_call(lit_models.export, "check", signal_name), [])}
    return cells


CELLS = [(command, phase, signal_name)
         for command in ("fit", "validate", "test", "predict", "export")
         for signal_name in SIGNALS
         for phase in phases(command, signal_name)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_mnist(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def unbroken(data, tmp_path_factory) -> dict:
    """The weights of the fit that nothing stopped."""
    return last_weights(fitted(tmp_path_factory.mktemp("unbroken"), data))


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory) -> Path:
    """A finished run for the use commands."""
    return fitted(tmp_path_factory.mktemp("trained"), data)


def fitted(cwd: Path, data: Path) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert run_train([*FIT, "--data.data_dir", str(data)]) == 0
    return runs(cwd)[0]


def last_weights(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def records(folder: Path) -> set[Path]:
    return {path for pattern in RECORDS for path in folder.rglob(pattern)}


def command_args(command: str, data: Path, checkpoint: Path, tmp_path: Path) -> list[str]:
    if command == "fit":
        return [*FIT, "--data.data_dir", str(data)]
    args = [command, "--ckpt_path", str(checkpoint)]
    if command == "export":
        return [*args, "--output", str(tmp_path / "model.onnx")]
    return [*args, "--data.data_dir", str(data), "--data.eval_batch_size", "20"]


@pytest.mark.parametrize("command, phase, signal_name", CELLS)
def test_a_stop_in_any_phase_of_any_command_ends_in_one_true_line(
        command, phase, signal_name, data, checkpoint, unbroken, tmp_path, capsys):
    patch_it, options = phases(command, signal_name)[phase]
    args = command_args(command, data, checkpoint, tmp_path)
    before = records(checkpoint.parent) | records(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        patch.syspath_prepend(str(Path(__file__).parent))
        if patch_it:
            patch_it(patch)
        code = run_train(args + options)
    err = capsys.readouterr().err
    by, expected = SIGNALS[signal_name]
    line = err.strip().splitlines()[-1]
    assert code == expected and "Traceback" not in err, err[-2000:]
    assert line.startswith(f"train.py: error: stopped by {by} "), line
    new = (records(checkpoint.parent) | records(tmp_path)) - before
    leftovers = [*tmp_path.rglob(".*.tmp*"), *checkpoint.parent.rglob(".*.tmp*")]
    assert not leftovers
    said_written = [path for path in new if f"{path} was written whole" in line]
    assert said_written == sorted(new), line  # what the line says was written, and nothing else
    if command == "fit":
        went_on_from_what_it_saved(line, args, tmp_path, unbroken)


def went_on_from_what_it_saved(line: str, args: list[str], cwd: Path, unbroken: dict) -> None:
    """A fit stopped before its end goes on from the checkpoint its line names, to the weights
    of the unbroken fit; one that saved none has none."""
    if "checkpoints are whole" in line:  # the fit ended: its test or record stopped
        assert last_weights(runs(cwd)[0]).keys() == unbroken.keys()
        return
    if "no checkpoint was written" in line or "nothing was written" in line:
        assert not list(cwd.rglob("*.ckpt"))
        return
    saved = line.split("; saved ")[1].split(";")[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert run_train([*args, "--ckpt_path", saved]) == 0
    resumed = last_weights(runs(cwd)[-1])
    # The network's weights and buffers; not the best validation accuracy's state (a fit stopped
    # in its last validation goes on without it: docs/reliability.md)
    assert all(torch.equal(resumed[k], unbroken[k]) for k in unbroken if "val_acc_best" not in k)


@pytest.mark.parametrize("signal_name", SIGNALS)
def test_a_stop_while_an_image_folder_is_decoded_leaves_no_part_of_its_cache(signal_name,
                                                                             tmp_path, capsys):
    from test_image_folder import write_folder

    import datamodules.image_folder

    folder = write_folder(tmp_path / "images", size=8)
    args = ["--data", "image_folder", "--data.root", str(folder), "--data.data_dir",
            str(tmp_path / "data"), "--model", "mlp", "--trainer.max_epochs", "1",
            "--data.batch_size", "32"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        at_call(datamodules.image_folder, "decode_files", signal_name)(patch)
        code = run_train(args)
    by, expected = SIGNALS[signal_name]
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == expected and line == (f"train.py: error: stopped by {by} in epoch 0 at step 0; "
                                         f"no checkpoint was written")
    assert not list((tmp_path / "data").rglob("*.npy*")) and not list(tmp_path.rglob("*.ckpt"))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        assert run_train(args) == 0  # the same command, decoded again


def test_a_callers_sigterm_handler_hears_a_held_sigterm_and_takes_it_when_the_trainer_call_ends():
    """A sweep's worker's handler: told at once that its sweep stops, the current handler again
    (which raises) only once the Trainer call has ended."""
    heard = []

    def callers(signum, frame):
        heard.append(signal.getsignal(signal.SIGTERM) is callers)

    previous = signal.signal(signal.SIGTERM, callers)
    try:
        stops = signals.Stops()
        stops.start()
        stops.hold()  # a Trainer call starts
        signal.raise_signal(signal.SIGTERM)  # before Lightning's handler is in place
        assert heard == [False] and stops.noted
        stops.release()  # the call ended
        assert heard == [False, True] and not stops.noted
        assert signal.getsignal(signal.SIGTERM) is callers
        stops.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
