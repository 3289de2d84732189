"""Two nodes as torchrun starts them (two launches on localhost, one rendezvous, gloo on the CPU),
and SLURM's requeue with the environment SLURM sets and a stand-in `scontrol`."""

import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch
from conftest import QUIET, ROOT, TRAIN, results, run_process, runs, write_mnist

PROBES = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}  # the command lines name probes.* callbacks
# 8 steps an epoch on each node, a test accuracy short of 1
TWO_NODES = ["--model", "mlp", "--data.batch_size", "32", "--trainer.max_epochs", "2",
             "--model.lr", "0.0003", "--trainer.accelerator", "cpu", "--trainer.num_nodes", "2",
             "--trainer.devices", "1", "--trainer.strategy", "ddp", *QUIET]

pytestmark = pytest.mark.slow  # several processes each: seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(args: list[str], cwd, timeout: int = 240) -> list[tuple[int, str]]:
    """`torchrun --nnodes 2 --nproc_per_node 1 --node_rank R ... train.py ARGS` for R = 0 and 1 at
    once, in `cwd`, as two machines sharing a file system would run it: each launch's exit code and
    output (also in cwd/node-R.log)."""
    port, launches = free_port(), []
    for rank in (0, 1):
        log = open(cwd / f"node-{rank}.log", "w")
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc_per_node", "1", "--node_rank", str(rank), "--master_addr", "127.0.0.1",
                   "--master_port", str(port), TRAIN, *args]
        launches.append((subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, env={**os.environ, **PROBES}),
                         log))
    try:
        codes = [proc.wait(timeout=timeout) for proc, _ in launches]
    finally:
        for proc, log in launches:
            if proc.poll() is None:  # a hang: the launch and its workers
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    return [(code, (cwd / f"node-{rank}.log").read_text()) for rank, code in enumerate(codes)]


def weights(run):
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted two-node fit: its folder (with the data)."""
    cwd = tmp_path_factory.mktemp("two_nodes")
    data = write_mnist(cwd / "data")
    for code, output in two_nodes([*TWO_NODES, "--data.data_dir", str(data),
                                   "--trainer.callbacks+=probes.SaveWeights"], cwd):
        assert code == 0, output[-3000:]
    return cwd


def test_two_nodes_train_identical_replicas_each_on_its_share(straight):
    assert ([(straight / f"environment-rank{r}.txt").read_text() for r in (0, 1)]
            == ["TorchElasticEnvironment"] * 2)
    zero, one = (torch.load(straight / f"weights-rank{r}.pt", weights_only=True) for r in (0, 1))
    assert all(torch.equal(zero[k], one[k]) for k in zero)
    (run,) = runs(straight)
    record = results(run)
    assert record["global_step"] == 2 * (540 // 2 // 32)  # each node its half of the images
    assert 0.2 < record["test/acc"] < 1
    alone = run_process(["test", "--ckpt_path", record["checkpoint"]], cwd=straight, env=PROBES)
    assert alone.returncode == 0, alone.stderr[-2000:]
    # every test image counted once
    assert results(runs(straight)[-1])["test/acc"] == record["test/acc"]


def test_sigterm_to_one_node_stops_both_with_a_checkpoint_and_the_resumed_run_ends_as_an_unbroken_one(  # noqa: E501
        straight, tmp_path):
    args = [*TWO_NODES, "--data.data_dir", str(straight / "data")]
    # Node 1's worker sends SIGTERM to its torchrun after step 5, which passes it on to that node's
    # worker only.
    stop = ["--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=5",
            "--trainer.callbacks.rank=1", "--trainer.callbacks.parent=true"]
    nodes = two_nodes(args + stop, tmp_path)
    saved = []
    for code, output in nodes:  # each node's worker stops at the same step, and says where it saved
        assert code != 0
        saved += re.findall(r"train\.py: error: stopped by SIGTERM in epoch 0 at step \d+; "
                            r"saved (\S+);", output)
    assert len(saved) == 2 and saved[0] == saved[1], [output[-3000:] for _, output in nodes]
    assert torch.load(saved[0], weights_only=True)["global_step"] >= 5
    for code, output in two_nodes(args + ["--ckpt_path", saved[0]], tmp_path):
        assert code == 0, output[-3000:]
    (run,), unbroken = runs(tmp_path), runs(straight)[0]  # resumed in its own directory
    assert results(run)["global_step"] == results(unbroken)["global_step"]
    assert results(run)["test/acc"] == results(unbroken)["test/acc"]
    mine, theirs = weights(run), weights(unbroken)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


# What an sbatch job's task sees (one task, one node), and SLURM's scontrol: it records the call,
# and ends the job as SLURM ends one it requeues, with SIGTERM (the caller, Lightning's process, is
# the job's task here).
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1",
         "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODELIST": "localhost"}
SCONTROL = '#!/bin/sh\necho "$@" >> "$SCONTROL_CALLS"\nkill -TERM "$PPID"\n'


def test_slurm_requeue_checkpoints_requeues_and_the_requeued_job_ends_as_an_unbroken_one(
        mnist_dir, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text(SCONTROL)
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    env = {**SLURM, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "SCONTROL_CALLS": str(tmp_path / "calls"), **PROBES}
    # 8 steps an epoch
    base = ["--model", "mlp", "--data.batch_size", "64", "--trainer.max_epochs", "3",
            "--data.data_dir", str(mnist_dir)]
    # The job's command: SIGUSR1 after step 5, as `sbatch --signal=SIGUSR1@90` sends it before the
    # time limit.
    job = [*base, "--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=5",
           "--trainer.callbacks.signal_name=SIGUSR1"]
    (tmp_path / "job").mkdir()
    stopped = run_process(job, cwd=tmp_path / "job", env=env)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert stopped.stderr.strip().splitlines()[-1].startswith(
        "train.py: error: stopped by SIGTERM in epoch 0")
    assert (tmp_path / "calls").read_text() == "requeue 4242\n"
    assert torch.load(tmp_path / "job" / "hpc_ckpt_1.ckpt", weights_only=True)["global_step"] == 5
    (run,) = runs(tmp_path / "job")
    assert run.name == "version_4242"  # Lightning's default logger names the run by the job
    first = (run / "config.yaml").read_text()
    # Requeued: the same command, in the same job, which SLURM now counts as restarted once.
    requeued = run_process(job, cwd=tmp_path / "job", env={**env, "SLURM_RESTART_COUNT": "1"})
    assert requeued.returncode == 0, requeued.stderr[-2000:]
    # it went on after step 5: no second signal
    assert (tmp_path / "calls").read_text() == "requeue 4242\n"
    # in the job's run directory, its first configuration kept
    assert runs(tmp_path / "job") == [run]
    assert (run / "config.yaml").read_text() == first and (run / "config-resumed.yaml").is_file()
    (tmp_path / "unbroken").mkdir()
    unbroken = run_process(base, cwd=tmp_path / "unbroken", env=env)
    assert unbroken.returncode == 0, unbroken.stderr[-2000:]
    (straight,) = runs(tmp_path / "unbroken")
    for key in ("global_step", "test/acc", "val/acc_best"):
        assert results(run)[key] == results(straight)[key]
    mine, theirs = weights(run), weights(straight)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
