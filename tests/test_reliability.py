"""Stopping and going on: real signals, exact resumes, a diverging loss, a full disk, bad input."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import QUIET, ROOT, TRAIN, results, run_process, run_train, runs, scalars

TESTS = str(ROOT / "tests")
# 8 steps an epoch
BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "3"]

pytestmark = pytest.mark.slow  # processes and signals: seconds each


def weights(run):
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """The runs to compare with: each variant trained straight through, in its own folder."""
    cache = {}

    def get(extra: tuple, data_dir) -> dict:
        if extra not in cache:
            cwd = tmp_path_factory.mktemp("unbroken")
            # In this process: no signal in it, so no process to test.
            assert in_folder(cwd, [*BASE, "--data.data_dir", str(data_dir), *extra]) == 0
            cache[extra] = runs(cwd)[0]
        return cache[extra]
    return get


def in_folder(cwd: Path, args: list[str]) -> int:
    """train.py's exit code for `args`, run in this process in `cwd`. A probe's signal goes to this
    process, as test_stops sends its own; one real process is stopped by one below."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.syspath_prepend(TESTS)
        return run_train(args)


@pytest.mark.parametrize("signal_name, code, step, extra", [
    ("SIGTERM", 143, 5, ()),  # mid-epoch
    ("SIGTERM", 143, 8, ()),  # at an epoch's last batch, before its validation
    ("SIGTERM", 143, 4, ("--trainer.accumulate_grad_batches", "3")),  # 3 steps an epoch
    ("SIGTERM", 143, 13, ("--trainer.val_check_interval", "0.5")),
    ("SIGINT", 130, 5, ()),  # Ctrl-C, mid-epoch
    ("SIGINT", 130, 8, ()),
])
def test_a_signal_stops_after_the_step_and_resuming_ends_as_an_unbroken_run(
        signal_name, code, step, extra, unbroken, mnist_dir, tmp_path, capsys):
    stop = ["--trainer.callbacks+=probes.SignalAt", f"--trainer.callbacks.step={step}",
            f"--trainer.callbacks.signal_name={signal_name}"]
    args = [*BASE, "--data.data_dir", str(mnist_dir), *extra]
    returned = in_folder(tmp_path, args + stop)
    err = capsys.readouterr().err
    assert returned == code, err[-2000:]
    message = err.strip().splitlines()[-1]
    assert message.startswith(
        f"train.py: error: stopped by {'Ctrl-C' if code == 130 else 'SIGTERM'} in epoch")
    assert "last.ckpt" in message and "Traceback" not in err
    assert torch.load(runs(tmp_path)[0] / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] >= step
    assert in_folder(tmp_path, args + ["--ckpt_path", "last"]) == 0
    (run,) = runs(tmp_path)  # resumed in its own directory
    straight = unbroken(tuple(extra), mnist_dir)
    assert results(run)["global_step"] == results(straight)["global_step"]
    assert results(run)["test/acc"] == results(straight)["test/acc"]
    assert results(run)["val/acc_best"] == results(straight)["val/acc_best"]
    # the steps before the stop count in their epoch's mean (Lightning's own sums restart
    # at a resume)
    if not extra:
        assert scalars(run)["train/loss_epoch"] == pytest.approx(
            scalars(straight)["train/loss_epoch"], rel=1e-6)
    mine, theirs = weights(run), weights(straight)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert (run / "config.yaml").is_file() and (run / "config-resumed.yaml").is_file()


def test_augmented_cifar10_resumes_exactly(cifar10_dir, tmp_path):
    args = ["--model", "cnn", "--data.data_dir", str(cifar10_dir), "--data.batch_size", "32",
            "--trainer.max_epochs", "2", "--trainer.callbacks+=probes.SignalAt",
            "--trainer.callbacks.step=7"]
    (tmp_path / "a").mkdir()
    assert in_folder(tmp_path / "a", args) == 143
    assert in_folder(tmp_path / "a", args[:-2] + ["--ckpt_path", "last"]) == 0
    (tmp_path / "b").mkdir()
    assert in_folder(tmp_path / "b", args[:-2]) == 0
    resumed, straight = weights(runs(tmp_path / "a")[0]), weights(runs(tmp_path / "b")[0])
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


# the test's last batch, or one before it
@pytest.mark.parametrize("eval_batch_size", ["1000", "20"])
def test_sigterm_while_testing_is_reported_not_hidden(eval_batch_size, mnist_dir, tmp_path,
                                                      capsys):
    returned = in_folder(tmp_path, [*BASE, "--data.data_dir", str(mnist_dir),
                                    "--trainer.callbacks+=probes.SignalAt",
                                    "--trainer.callbacks.step=-1",
                                    "--data.eval_batch_size", eval_batch_size])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert returned == 143 and "stopped by SIGTERM while testing" in last
    record = results(runs(tmp_path)[0])  # the fit's record, whatever its test did
    assert record["test"] == "stopped" and record["test/acc"] is None and record["epochs"] == 3
    assert last.endswith("results.json was written whole")


def test_a_sigterm_before_lightnings_handler_lets_the_trainer_finish_its_call_then_stops(
        mnist_dir, tmp_path, capsys):
    """Raised where it landed, such a SIGTERM broke TensorBoard's queue (a sweep's worker stopped
    two minutes late): it is held until Lightning's stage starts."""
    flag = tmp_path / "finished"
    returned = in_folder(tmp_path, [*BASE, "--data.data_dir", str(mnist_dir),
                                    "--trainer.callbacks+=probes.SignalAsTheFitStarts",
                                    f"--trainer.callbacks.flag={flag}"])
    err = capsys.readouterr().err
    assert returned == 143 and flag.read_text() == "done", err[-2000:]
    assert err.strip().splitlines()[-1].startswith(
        "train.py: error: stopped by SIGTERM in epoch 0 at step 1; saved ")
    (run,) = runs(tmp_path)
    assert "Traceback" not in err and (run / "checkpoints" / "last.ckpt").is_file()
    assert not (run / "results.json").exists()


def test_sigterm_after_the_last_step_before_the_test_is_not_lost(mnist_dir, tmp_path):
    """A real process stopped by a real signal: its exit code as the system gives it."""
    proc = run_process([*BASE, "--data.data_dir", str(mnist_dir),
                        "--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=-4"],
                       cwd=tmp_path, env={"PYTHONPATH": f"{ROOT}:{TESTS}"})
    (run,) = runs(tmp_path)
    assert proc.returncode == 143 and proc.stderr.strip().splitlines()[-1] == (
        f"train.py: error: stopped by SIGTERM after the fit, before its test; its checkpoints are "
        f"whole: train.py test --ckpt_path {run} tests it")
    assert (not (run / "results.json").exists()
            and torch.load(run / "checkpoints" / "last.ckpt")["epoch"] == 2)


@pytest.mark.parametrize("command, step, said", [
    ("test", -1, "while testing"), ("validate", -2, "while validating"),
    ("predict", -3, "while predicting")])
def test_sigterm_stops_every_use_command_with_a_true_line(command, step, said, trained, capsys):
    returned = in_folder(trained.cwd, [command, "--ckpt_path", str(trained.run),
                                       "--data.eval_batch_size", "20",
                                       "--trainer.callbacks+=probes.SignalAt",
                                       f"--trainer.callbacks.step={step}"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert returned == 143 and said in last and "Traceback" not in err, err[-1500:]
    assert not list(trained.run.glob("predictions-*.csv"))


def test_sigterm_during_validation_saves_where_it_stopped_and_resumes_exactly(mnist_dir, tmp_path,
                                                                              unbroken, capsys):
    args = [*BASE, "--data.data_dir", str(mnist_dir)]
    returned = in_folder(tmp_path, args + ["--trainer.callbacks+=probes.SignalAt",
                                           "--trainer.callbacks.step=-2"])
    err = capsys.readouterr().err
    assert returned == 143 and "saved" in err.strip().splitlines()[-1], err[-1500:]
    assert torch.load(runs(tmp_path)[0] / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 8
    assert in_folder(tmp_path, args + ["--ckpt_path", "last"]) == 0
    mine, theirs = weights(runs(tmp_path)[0]), weights(unbroken((), mnist_dir))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_diverging_loss_stops_in_one_line_and_no_checkpoint_holds_it(mnist_dir, tmp_path,
                                                                       monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_train([*BASE, "--data.data_dir", str(mnist_dir), "--model.lr", "1e12"]) == 1
    err = capsys.readouterr().err
    assert "the weights became NaN or infinite in epoch 0" in err and "--model.lr" in err
    for checkpoint in tmp_path.rglob("*.ckpt"):
        state = torch.load(checkpoint, weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_a_one_cycle_run_resumed_with_another_length_plans_a_new_cycle(trained, tmp_path,
                                                                        monkeypatch, capsys):
    """Refused once ("planned for 24 optimizer steps"): a finished run now trains on (issue 48,
    tests/test_resume_changes.py). On a copy: the module's other tests use the run."""
    run = tmp_path / "lightning_logs" / "version_0"
    shutil.copytree(trained.run, run)
    monkeypatch.chdir(tmp_path)
    assert run_train(["--config", str(run / "config.yaml"), "--ckpt_path", "last",
                      "--trainer.max_epochs", "5"]) == 0
    assert "a new OneCycle schedule from step 24 to 40" in capsys.readouterr().err


def test_a_full_disk_stops_in_one_line_and_the_checkpoints_before_stay_whole(mnist_dir, tmp_path,
                                                                           capsys):
    returned = in_folder(tmp_path, [*BASE, "--data.data_dir", str(mnist_dir),
                                    "--trainer.plugins=probes.FullDisk"])
    err = capsys.readouterr().err
    assert returned == 1 and "Traceback" not in err
    assert "No space left on device" in err.strip().splitlines()[-1]
    for checkpoint in (runs(tmp_path)[0] / "checkpoints").glob("*.ckpt"):
        assert torch.load(checkpoint, weights_only=True)["epoch"] == 0  # whole


@pytest.mark.parametrize("args, phrase", [
    (["--data.batch_size", "0"], "--data.batch_size 0"),
    (["--trainer.max_epochs", "abc"], 'Parser key "trainer.max_epochs"'),
    (["--model.net", "no_such_network"],
     "unknown --model.net 'no_such_network'; choose one of: cnn, mlp"),
    (["--data.val_size", "-1"], "val_size -1"),
    (["--model.scheduler.warmup", "1.5"], "warmup must be between 0 and 1"),
    (["--config", "nothing.yaml"], "nothing.yaml"),
    (["--trainer.enable_progress_bar", "false", "--trainer.callbacks+=TQDMProgressBar"],
     "enable_progress_bar=False"),
    (["fitt"], "unknown subcommand 'fitt'"),
    (["--model.foo", "1"], "foo"),
])
def test_bad_input_exits_non_zero_without_a_traceback(args, phrase, mnist_dir, tmp_path,
                                                      monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = run_train(args[:1] if args == ["fitt"]
                     else [*BASE, "--data.data_dir", str(mnist_dir), *args], quiet=False)
    err = capsys.readouterr().err
    assert code in (1, 2) and phrase in err and "Traceback" not in err


def test_missing_data_offline_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_train(["--model", "mlp", "--data.data_dir", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert ("Traceback" not in err and "could not be downloaded" in err.splitlines()[-1]
            and "MNIST/raw" in err)


def test_results_are_json_with_no_nan(trained):
    text = (trained.run / "results.json").read_text()
    assert "NaN" not in text and all(not isinstance(v, float) or math.isfinite(v)
                                     for v in json.loads(text).values())


@pytest.mark.parametrize("edit, phrase", [
    ("weights only", "cannot resume training: it has no optimizer_states, lr_schedulers, loops"),
    ("a key deleted",
     "weights do not fit this model (mlp for 10 classes of (1, 28, 28) images): net.fc1.bias"),
])
def test_a_checkpoint_that_cannot_be_resumed_is_one_line(edit, phrase, trained, tmp_path,
                                                         monkeypatch, capsys):
    checkpoint = torch.load(trained.run / "checkpoints" / "last.ckpt", weights_only=True)
    if edit == "weights only":
        checkpoint = {k: v for k, v in checkpoint.items()
                      if k not in ("optimizer_states", "lr_schedulers", "loops")}
    else:
        del checkpoint["state_dict"]["net.fc1.bias"]
    torch.save(checkpoint, tmp_path / "edited.ckpt")
    monkeypatch.chdir(trained.cwd)
    assert run_train(["--config", str(trained.run / "config.yaml"),
                      "--ckpt_path", str(tmp_path / "edited.ckpt")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and phrase in err.strip().splitlines()[-1]


def test_a_missing_optional_package_is_named(mnist_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("lightning.pytorch.callbacks.progress.rich_progress._RICH_AVAILABLE", False)
    monkeypatch.chdir(tmp_path)
    assert run_train([*BASE, "--data.data_dir", str(mnist_dir),
                      "--trainer.callbacks+=RichProgressBar"], quiet=False) == 1
    err = capsys.readouterr().err
    assert ("Traceback" not in err
            and "`RichProgressBar` requires `rich`" in err.strip().splitlines()[-1])


def test_a_run_with_swa_replays_and_predicts(mnist_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = [*BASE, "--data.data_dir", str(mnist_dir),
            "--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs=0.01",
            "--trainer.callbacks.swa_epoch_start=1"]
    # train.py builds the network from the data before SWA copies the model
    assert run_train(args) == 0
    (run,) = runs(tmp_path)
    assert run_train(["--config", str(run / "config.yaml")]) == 0  # the saved config replays
    assert results(runs(tmp_path)[-1])["test/acc"] == results(run)["test/acc"]
    assert run_train(["predict", "--ckpt_path", str(run)]) == 0


def test_bf16_true_keeps_the_best_validation_accuracy_exactly(mnist_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_train([*BASE, "--data.data_dir", str(mnist_dir),
                      "--trainer.precision", "bf16-true"]) == 0
    logged = scalars(runs(tmp_path)[0])
    assert logged["val/acc_best"][-1] == max(logged["val/acc"])


def test_the_batch_size_finder_from_the_command_line_records_the_run(mnist_dir, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    # OneCycle's plan would not fit its batches
    assert run_train([*BASE, "--data.data_dir", str(mnist_dir),
                      "--trainer.callbacks+=BatchSizeFinder", "--trainer.callbacks.max_trials=2",
                      "--trainer.callbacks.init_val=32", "--model.scheduler=null"]) == 0
    record = results(runs(tmp_path)[0])
    assert record["epochs"] == 3 and record["global_step"] > 0


def test_a_checkpoint_whose_std_is_zero_is_refused(trained, tmp_path, monkeypatch, capsys):
    checkpoint = torch.load(trained.run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["std"] = [0.0]
    torch.save(checkpoint, tmp_path / "zero.ckpt")
    monkeypatch.chdir(trained.cwd)
    assert run_train(["export", "--ckpt_path", str(tmp_path / "zero.ckpt"),
                      "--output", str(tmp_path / "m.onnx")]) == 1
    assert "std > 0" in capsys.readouterr().err and not (tmp_path / "m.onnx").exists()


def test_a_mid_epoch_checkpoint_without_the_data_position_is_refused(mnist_dir, tmp_path,
                                                                     capsys):
    """An earlier version's checkpoint has no position in the epoch: resuming would train some
    batches twice."""
    args = [*BASE, "--data.data_dir", str(mnist_dir)]
    stopped = in_folder(tmp_path, args + ["--trainer.callbacks+=probes.SignalAt",
                                          "--trainer.callbacks.step=5"])
    assert stopped == 143, capsys.readouterr().err[-2000:]
    last = runs(tmp_path)[0] / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint.pop("MNISTDataModule")["train_batches"] == {"epoch": 0, "batches": 5}
    torch.save(checkpoint, last)
    capsys.readouterr()
    resumed = in_folder(tmp_path, args + ["--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert resumed == 1 and "Traceback" not in err
    message = err.strip().splitlines()[-1]
    assert (message.startswith("train.py: error: ")
            and "middle of epoch 0 without the position of MNISTData" in message)
    # left as it was
    assert torch.load(last, weights_only=True)["global_step"] == checkpoint["global_step"]


def test_many_epochs_with_the_default_logger_do_not_grow_memory(mnist_dir, tmp_path):
    """An earlier version grew by 0.16 MB an epoch with TensorBoard (not in the Python heap): 20 MB
    over these."""
    proc = run_process([*BASE, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs", "150",
                        "--trainer.limit_train_batches", "1",
                        "--trainer.callbacks+=probes.MemoryGrowth"],
                       cwd=tmp_path, env={"PYTHONPATH": f"{ROOT}:{TESTS}"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(scalars(runs(tmp_path)[0])["val/acc"]) == 150  # TensorBoard got every epoch
    assert float((tmp_path / "memory.txt").read_text()) < 8


def test_damaged_or_diverged_checkpoints_are_refused_in_one_line(trained, tmp_path, monkeypatch,
                                                                capsys):
    good = trained.run / "checkpoints" / "last.ckpt"
    flipped = bytearray(good.read_bytes())
    # inside the weights: the zip still opens
    flipped[len(flipped) // 2:len(flipped) // 2 + 64] = bytes(64)
    (tmp_path / "flipped.ckpt").write_bytes(flipped)
    contents = torch.load(good, weights_only=True)
    contents["state_dict"]["net.fc1.weight"][0, 0] = float("nan")
    torch.save(contents, tmp_path / "nan.ckpt")
    contents = torch.load(good, weights_only=True) | {"pytorch-lightning_version": "edited"}
    torch.save(contents, tmp_path / "version.ckpt")
    monkeypatch.chdir(trained.cwd)
    for name, said in (("flipped", "is damaged"), ("nan", "holds NaN or infinite weights"),
                       ("version", "no valid pytorch-lightning_version")):
        for command in ("test", "export"):
            assert run_train([command, "--ckpt_path",
                              str(tmp_path / f"{name}.ckpt")]) == 1, (name, command)
            assert said in capsys.readouterr().err.strip().splitlines()[-1]
    assert not list(tmp_path.glob("*.onnx"))


def test_an_optimizers_own_refusal_is_one_line(mnist_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["--data.data_dir", str(mnist_dir), "--model.lr", "null", "--model.optimizer.lr", "-1"]
    assert run_train([*BASE, *args]) == 1
    assert ("--model.optimizer: Invalid learning rate: -1.0"
            in capsys.readouterr().err.strip().splitlines()[-1])


def test_resuming_a_finished_run_trains_nothing_and_leaves_its_record(trained, monkeypatch, capsys):
    monkeypatch.chdir(trained.cwd)
    before = (trained.run / "results.json").read_text()
    assert run_train(["--ckpt_path", str(trained.run / "checkpoints" / "last.ckpt")]) == 0
    assert "finished its 3 epochs" in capsys.readouterr().err
    assert (trained.run / "results.json").read_text() == before


@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 1 MiB (tmpfs), mounted where the machine allows it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small file system needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_really_full_disk_is_named_and_left_with_no_part_of_a_checkpoint(small_disk, mnist_dir,
                                                                           tmp_path):
    # The checkpoint (1.2 MB with AdamW's state) does not fit; the system's temporary folder is on
    # another disk.
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    proc = run_process([*BASE, "--data.data_dir", str(mnist_dir),
                        "--trainer.default_root_dir", str(small_disk)],
                       cwd=tmp_path, env={"TMPDIR": str(temporary)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    checkpoints = small_disk / "lightning_logs" / "version_0" / "checkpoints"
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith(f"train.py: error: No space left on device: {checkpoints}/"), message
    # nothing half written
    assert not [p for p in small_disk.rglob("*") if p.is_file() and ".ckpt" in p.name]
    assert not list(temporary.glob("tmp*"))  # (what Lightning's writer leaves there)


def test_files_are_written_whole_and_a_killed_writers_leftovers_go(tmp_path):
    from lit_common.files import HOST, written_whole

    target = tmp_path / "record.json"
    target.write_text("old")
    with pytest.raises(ValueError), written_whole(target) as tmp:
        tmp.write_text("half")
        raise ValueError
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["record.json"]
    writer = (f"import time\nfrom lit_common.files import written_whole\n"
              f"with written_whole('{target}') as tmp:\n"
              f" tmp.write_text('half'); print(tmp, flush=True); time.sleep(60)")
    killed = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    leftover = Path(killed.stdout.readline().strip())
    killed.kill()
    killed.wait()
    others = [tmp_path / f".x.{os.getpid()}@{HOST}.tmp",
              tmp_path / f".x.{killed.pid}@another-host.tmp"]
    for other in others:  # a live writer's, and one of another machine sharing the folder
        other.touch()
    assert leftover.is_file() and leftover.parent == tmp_path
    with written_whole(tmp_path / "other.json") as tmp:
        tmp.write_text("{}")
    assert (not leftover.exists() and all(p.exists() for p in others)
            and target.read_text() == "old")
    with pytest.raises(IsADirectoryError,
                       match=f"a folder, not a file: '{tmp_path}'"), written_whole(tmp_path):
        pass


def test_checkpoints_are_written_beside_them_unless_the_user_gives_a_checkpoint_io(
        mnist_dir, tmp_path, monkeypatch):
    from lightning.pytorch.plugins import AsyncCheckpointIO

    import train
    from lit_common.files import WholeCheckpointIO

    monkeypatch.chdir(tmp_path)
    for plugins, kind in (([], WholeCheckpointIO),
                          (["--trainer.plugins=AsyncCheckpointIO"], AsyncCheckpointIO)):
        cli = train.TrainCLI(["--model", "mlp", "--data.data_dir", str(mnist_dir), *plugins],
                             run=False)
        assert type(cli.trainer.strategy.checkpoint_io) is kind


def test_runs_started_together_each_get_a_run_of_their_own(mnist_dir, tmp_path):
    args = [sys.executable, TRAIN, *BASE, "--data.data_dir", str(mnist_dir),
            "--trainer.max_epochs", "1", *QUIET]
    procs = [subprocess.Popen(args, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [proc.communicate(timeout=240) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err[-1500:] for _, err in outputs]
    folders = runs(tmp_path)
    assert [f.name for f in folders] == ["version_0", "version_1", "version_2"]
    assert sorted(results(f)["log_dir"] for f in folders) == sorted(str(f) for f in folders)
    for folder in folders:
        assert ((folder / "config.yaml").is_file()
                and len(list((folder / "checkpoints").glob("*.ckpt"))) == 2)
