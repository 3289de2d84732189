"""Runs that survive: stopped by SIGTERM or Ctrl-C and resumed, they end exactly where an unbroken run does."""

import json

import pytest
import torch
import yaml
from helpers import ROOT, results, run_dirs, run_subprocess

# 500 training images in batches of 50: 10 steps an epoch, 30 in all.
ARGS = ["--model", "mlp", "--data.val_size=100", "--data.eval_batch_size=64", "--data.batch_size=50",
        "--trainer.max_epochs=3"]
PROBES = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}


def final_state(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """One run of 3 epochs without a stop, to compare the resumed ones with."""
    from conftest import write_mnist

    cwd = tmp_path_factory.mktemp("unbroken")
    data = write_mnist(cwd / "data")
    proc = run_subprocess([*ARGS, "--data.data_dir", str(data)], cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = run_dirs(cwd)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("signal_at, step", [(15, 18), (20, 20)], ids=["mid-epoch", "epoch-end"])
def test_sigterm_then_resume_ends_like_an_unbroken_run(signal_at, step, unbroken, mnist_dir, tmp_path):
    # 10 steps an epoch in calls of 8 and 2: a signal during a call stops at its end, steps 18 and 20 here
    probe = json.dumps({"class_path": "probes.SigtermAtStep", "init_args": {"step": signal_at}})
    stopped = run_subprocess([*ARGS, "--data.data_dir", str(mnist_dir), f"--trainer.callbacks+={probe}"],
                             cwd=tmp_path, env=PROBES)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    (run,) = run_dirs(tmp_path)
    assert f"stopped by SIGTERM in epoch {(step - 1) // 10} at step {step}" in stopped.stderr
    assert "--ckpt_path last" in stopped.stderr and "Traceback" not in stopped.stderr
    # Stopped mid-epoch, last.ckpt is where it stopped. Stopped after an epoch's last batch, before its
    # validation, last.ckpt stays at the end of the epoch before, which the resumed run repeats.
    saved_step = step if step % 10 else step - 10
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == saved_step
    assert ("its last epoch will run again" in stopped.stderr) == (step % 10 == 0)
    assert not (run / "results.json").exists()  # stopped runs do not test
    config_before = (run / "config.yaml").read_text()

    resumed = run_subprocess([*ARGS, "--data.data_dir", str(mnist_dir), "--ckpt_path", "last"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert run_dirs(tmp_path) == [run]  # the same run directory, no new one
    assert (run / "config.yaml").read_text() == config_before
    assert yaml.safe_load((run / "config.resume1.yaml").read_text())["ckpt_path"] == "last"
    theirs, ours = final_state(unbroken), final_state(run)
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
    for key in ("test/acc", "test/loss", "val/acc_best", "epochs"):
        assert results(run)[key] == results(unbroken)[key], key
    assert results(run)["resumed_from"].endswith("last.ckpt")


@pytest.mark.slow
def test_ctrl_c_stops_after_the_step_and_resumes_exactly(unbroken, mnist_dir, tmp_path):
    probe = json.dumps({"class_path": "probes.InterruptAtStep", "init_args": {"step": 13}})
    proc = run_subprocess([*ARGS, "--data.data_dir", str(mnist_dir), f"--trainer.callbacks+={probe}"],
                          cwd=tmp_path, env=PROBES)
    assert proc.returncode == 130
    assert "stopped by Ctrl-C in epoch 1 at step 18" in proc.stderr and "Traceback" not in proc.stderr
    (run,) = run_dirs(tmp_path)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 18
    resumed = run_subprocess([*ARGS, "--data.data_dir", str(mnist_dir), "--ckpt_path", "last"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    theirs, ours = final_state(unbroken), final_state(run)
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_resuming_a_finished_run_changes_nothing_and_says_so(unbroken, tmp_path):
    before = {p: p.read_bytes() for p in unbroken.rglob("*") if p.is_file()}
    data = unbroken.parents[2] / "data"
    proc = run_subprocess([*ARGS, "--data.data_dir", str(data), "--ckpt_path", str(unbroken)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "has already trained its 3 epochs" in proc.stderr and "train.py test --ckpt_path" in proc.stderr
    assert {p: p.read_bytes() for p in unbroken.rglob("*") if p.is_file()} == before  # nothing rewritten
    assert not (tmp_path / "lightning_logs").exists()  # nor a new run started
