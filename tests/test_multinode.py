"""SLURM's requeue as plain Lightning handles it (its SLURMEnvironment, auto_requeue): the
environment SLURM sets for a job's one task, and a stand-in `scontrol`. Two nodes under torchrun:
tests/test_ddp.py."""

import os

import pytest
import torch
from conftest import ROOT, results, run_train, runs

# What an sbatch job's task sees (one task, one node).
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1",
         "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODELIST": "localhost"}
# SLURM's scontrol: it records the call, and ends the job as SLURM ends one it requeues, with
# SIGTERM (its caller, Lightning's process, is the job's task: here, this one).
SCONTROL = '#!/bin/sh\necho "$@" >> "$SCONTROL_CALLS"\nkill -TERM "$PPID"\n'
# 8 steps an epoch
BASE = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "2"]

pytestmark = pytest.mark.slow  # a fit or more each: seconds


def test_a_requeued_slurm_job_goes_on_from_lightnings_checkpoint_and_ends_as_an_unbroken_fit(
        mnist_dir, tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text(SCONTROL)
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("SCONTROL_CALLS", str(tmp_path / "calls"))
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    base = [*BASE, "--data.data_dir", str(mnist_dir)]
    # The job's command: SIGUSR1 after step 5, as `sbatch --signal=SIGUSR1@90` sends it before the
    # time limit.
    job = [*base, "--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=5",
           "--trainer.callbacks.signal_name=SIGUSR1"]
    for folder in ("job", "unbroken"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "job")
    assert run_train(job) == 143
    assert (tmp_path / "calls").read_text() == "requeue 4242\n"
    assert torch.load(tmp_path / "job" / "hpc_ckpt_1.ckpt", weights_only=True)["global_step"] == 5
    # Requeued: the same command, in the same job, which SLURM now counts as restarted once.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert run_train(job) == 0
    assert (tmp_path / "calls").read_text() == "requeue 4242\n"  # it went on after step 5
    monkeypatch.chdir(tmp_path / "unbroken")
    assert run_train(base) == 0
    run, straight = runs(tmp_path / "job")[-1], runs(tmp_path / "unbroken")[0]
    for key in ("test/acc", "test/loss", "val/acc_best"):
        assert results(run)["metrics"][key] == results(straight)["metrics"][key]
    mine = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    theirs = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
