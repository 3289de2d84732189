"""Hostile but realistic use: odd Trainer flags, runs started together, signals while testing, resumes that
cannot be exact unless the data path and accumulation are, full disks, and values that must be refused."""

import json
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, TRAIN, results, run_dirs, run_inprocess, run_subprocess

SMALL = ["--model", "mlp", "--data.val_size=100", "--data.batch_size=50", "--trainer.accelerator=cpu"]
PROBES = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}


def ours(stderr: str) -> list[str]:
    """What train.py itself printed to stderr (not Lightning's informational log lines)."""
    return [line for line in stderr.strip().splitlines() if line.startswith(("usage:", "train.py:"))]


def tree(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_fast_dev_run_trains_tests_and_writes_nothing(mnist_dir, in_tmp, capsys):
    assert run_inprocess([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.fast_dev_run=true"]) == 0
    assert "nothing written (fast_dev_run)" in capsys.readouterr().out
    assert not run_dirs(in_tmp)


def test_without_a_logger_the_run_still_has_its_directory(mnist_dir, in_tmp):
    args = [*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=1", "--trainer.logger=false"]
    assert run_inprocess(args) == 0 and run_inprocess(args) == 0
    first, second = run_dirs(in_tmp)
    for run in (first, second):
        assert {p.name for p in run.iterdir()} == {"checkpoints", "config.yaml", "results.json"}  # no events
    assert sorted(p.name for p in in_tmp.iterdir()) == ["data", "lightning_logs"]  # nothing else in the working dir


@pytest.mark.slow
def test_runs_started_together_get_their_own_directories(mnist_dir, tmp_path):
    args = [sys.executable, TRAIN, *SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=1",
            "--trainer.enable_progress_bar=false"]
    procs = [subprocess.Popen(args, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
    runs = run_dirs(tmp_path)
    assert sorted(r.name for r in runs) == ["version_0", "version_1"]
    # each run's events (fit and test: written by one process) and results in its own directory
    writers = [{p.name.split(".")[-2] for p in run.glob("events.out.tfevents.*")} for run in runs]
    assert all(len(w) == 1 for w in writers) and writers[0] != writers[1]
    assert all((run / "results.json").is_file() for run in runs)


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, code, name", [("SIGTERM", 143, "SIGTERM"), ("SIGINT", 130, "Ctrl-C")])
def test_a_signal_while_testing_is_reported_not_hidden(signal_name, code, name, mnist_dir, tmp_path):
    probe = json.dumps({"class_path": "probes.SignalDuringTest", "init_args": {"signal_name": signal_name}})
    proc = run_subprocess([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=1",
                           "--data.eval_batch_size=50", f"--trainer.callbacks+={probe}"], cwd=tmp_path, env=PROBES)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert f"stopped by {name} while testing" in proc.stderr and "Traceback" not in proc.stderr
    (run,) = run_dirs(tmp_path)
    assert not (run / "results.json").exists() and (run / "checkpoints" / "last.ckpt").is_file()


def test_a_checkpoint_of_other_classes_is_refused_and_last_stays_in_its_series(mnist_dir, fashion_mnist_dir, in_tmp,
                                                                              capsys):
    assert run_inprocess([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=1"]) == 0
    (mnist_run,) = run_dirs(in_tmp)
    before = tree(mnist_run)
    fashion = [*SMALL, "--data", "fashion_mnist", "--data.data_dir", str(fashion_mnist_dir), "--trainer.max_epochs=2"]
    assert run_inprocess([*fashion, "--ckpt_path", "last"]) == 1
    assert "no run in" in capsys.readouterr().err  # `last` of mlp-fashion_mnist, not the newest run of any data
    assert run_inprocess([*fashion, "--ckpt_path", str(mnist_run / "checkpoints" / "last.ckpt")]) == 1
    assert "trained on other classes" in capsys.readouterr().err
    assert tree(mnist_run) == before and run_dirs(in_tmp) == [mnist_run]


def test_resume_says_which_checkpoint_it_found(mnist_dir, in_tmp, capsys):
    args = [*SMALL, "--data.data_dir", str(mnist_dir), "--model.scheduler=null"]
    assert run_inprocess([*args, "--trainer.max_epochs=1"]) == 0
    (run,) = run_dirs(in_tmp)
    capsys.readouterr()
    assert run_inprocess([*args, "--trainer.max_epochs=2", "--ckpt_path", "last"]) == 0  # a constant rate extends
    out = capsys.readouterr().out
    assert f"Resuming {run / 'checkpoints' / 'last.ckpt'} (mlp for 10 classes, epoch 0, step 10)" in out
    assert results(run)["epochs"] == 2 and results(run)["epochs_this_run"] == 1
    assert "1 of its 2 epochs" in out


def test_a_one_cycle_run_is_not_extended_and_short_runs_plan_their_cycle(cifar10_dir, in_tmp, capsys):
    args = ["--model", "cnn", "--data.data_dir", str(cifar10_dir), "--data.val_size=100", "--data.batch_size=40",
            "--trainer.accelerator=cpu", "--trainer.limit_train_batches=4"]
    assert run_inprocess([*args, "--trainer.max_epochs=1"]) == 0  # 4 OneCycle steps in all, warm-up 0.25: 1 step
    (run,) = run_dirs(in_tmp)
    before = tree(run)
    assert run_inprocess([*args, "--trainer.max_epochs=2", "--ckpt_path", "last"]) == 1
    err = capsys.readouterr().err
    assert "OneCycle schedule was planned for 4 optimizer steps" in err and "this run would take 8" in err
    assert len(ours(err)) == 1 and "Traceback" not in err
    assert tree(run) == before  # not even a config.resume1.yaml


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--trainer.accumulate_grad_batches=3"], ["--data.on_device=false",
                                                                            "--data.num_workers=0"]],
                         ids=["accumulation", "dataloader"])
def test_sigterm_and_resume_are_exact_with_accumulation_and_the_dataloader_path(extra, mnist_dir, tmp_path):
    args = [*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=2", "--data.crop_padding=2",
            "--data.flip=true", "--data.steps_per_call=2", "--trainer.enable_progress_bar=false", *extra]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    unbroken = run_subprocess(args, cwd=tmp_path / "a")
    assert unbroken.returncode == 0, unbroken.stderr[-2000:]
    probe = json.dumps({"class_path": "probes.SigtermAtStep", "init_args": {"step": 2}})
    stopped = run_subprocess([*args, f"--trainer.callbacks+={probe}"], cwd=tmp_path / "b", env=PROBES)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    resumed = run_subprocess([*args, "--ckpt_path", "last"], cwd=tmp_path / "b")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (a,), (b,) = run_dirs(tmp_path / "a"), run_dirs(tmp_path / "b")
    theirs, ours = (torch.load(r / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for r in (a, b))
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_a_full_disk_stops_with_one_line_and_the_checkpoints_before_stay_whole(mnist_dir, tmp_path):
    probe = json.dumps({"class_path": "probes.DiskFullAfterEpoch", "init_args": {"epoch": 1}})
    proc = run_subprocess([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=3",
                           f"--trainer.callbacks+={probe}"], cwd=tmp_path, env=PROBES)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "could not write the checkpoint" in proc.stderr and "No space left on device" in proc.stderr
    (run,) = run_dirs(tmp_path)
    files = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(files) == 2 and "last.ckpt" in files  # no temporary files left behind
    for name in files:  # whole checkpoints, of the end of epoch 0
        assert torch.load(run / "checkpoints" / name, weights_only=True)["global_step"] == 10


@pytest.mark.parametrize("args, phrase", [
    (["--model.scheduler.warmup", "1.5"], "warmup must be a fraction"),
    (["--model.label_smoothing", "2"], "--model.label_smoothing: 2"),
    (["--seed_everything", "-1"], "a seed is an integer from 0 to 4294967295"),
    (["--trainer.max_epochs", "-5"], "max_epochs"),
    (["--model.optimizer.lr", "-1"], "Invalid learning rate"),
    (["--data.batch_size", "0"], "--data.batch_size: 0"),
], ids=["warmup", "label-smoothing", "seed", "max-epochs", "lr", "batch-size"])
def test_bad_values_exit_2_with_one_line(args, phrase, mnist_dir, in_tmp, capsys):
    assert run_inprocess([*SMALL, "--data.data_dir", str(mnist_dir), *args]) == 2
    err = capsys.readouterr().err
    lines = ours(err)
    assert len(lines) == 2 and lines[0].startswith("usage:") and phrase in lines[1], err[-1500:]
    assert "Traceback" not in err
    assert not (in_tmp / "lightning_logs").exists()  # no empty run directory left behind


@pytest.mark.parametrize("content, phrase", [(b"\xff\xfe\x00\x80 not text", "is not a text file"),
                                             (b"", "is empty"), (b"[1, 2]", "not a mapping")])
def test_config_files_that_are_not_configs(content, phrase, in_tmp, capsys):
    (in_tmp / "bad.yaml").write_bytes(content)
    assert run_inprocess(["--config", "bad.yaml"]) == 2
    assert phrase in capsys.readouterr().err


def test_a_cnn_on_images_too_small_for_it_is_one_line(tmp_path, in_tmp, capsys):
    from test_image_folder import write_folder

    root = write_folder(tmp_path / "tiny", size=8)
    assert run_inprocess(["--model", "cnn", "--data", "image_folder", "--data.root", str(root),
                          "--data.data_dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert "at least 16x16 pixels, these are 8x8" in err and "Traceback" not in err


def test_zero_epochs_and_a_class_without_test_images(mnist_dir, in_tmp, capsys):
    from conftest import class_images, write_idx

    images, labels = class_images(200, 1, 28, seed=7)
    keep = labels != 3  # no test image of class 3
    raw = mnist_dir / "MNIST" / "raw"
    write_idx(raw / "t10k-images-idx3-ubyte", images[keep][..., 0])
    write_idx(raw / "t10k-labels-idx1-ubyte", labels[keep])
    assert run_inprocess([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=0"]) == 0
    out = capsys.readouterr().out
    assert "Accuracy for class: 3 - three is no test images" in out
    res = results(run_dirs(in_tmp)[0])
    assert res["val/acc_best"] is None and res["test/acc_per_class"]["3 - three"] is None
    assert "-Infinity" not in (run_dirs(in_tmp)[0] / "results.json").read_text()


@pytest.mark.slow
def test_sigterm_before_the_first_checkpoint_says_there_is_nothing_to_resume(mnist_dir, tmp_path):
    # In epoch 0's validation (5 batches): its training is done, so no checkpoint is written (see LastCheckpoint)
    probe = json.dumps({"class_path": "probes.SigtermDuringFirstValidation"})
    proc = run_subprocess([*SMALL, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=2",
                           "--data.eval_batch_size=20", f"--trainer.callbacks+={probe}"], cwd=tmp_path, env=PROBES)
    assert proc.returncode == 143
    assert "before the first checkpoint: nothing to resume" in proc.stderr and "--ckpt_path last" not in proc.stderr
