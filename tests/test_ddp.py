"""Several processes on the CPU (gloo): two DDP processes as the README shows them, in a terminal
with the default progress bar; and two nodes as torchrun starts them (two launches on localhost,
one rendezvous), one of which gets SIGTERM.

Both have a world of two processes, each training on its half of the images: the two-node fit that
was stopped and went on ends as the two-process one, which nothing stopped."""

import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch
from conftest import PROBES, QUIET, TRAIN, results, run_in_terminal, run_train, runs, write_mnist

# 8 steps an epoch on each process (540 images, half each, in batches of 32), 16 in all; a test
# accuracy short of 1.
FIT = ["--model", "mlp", "--data.batch_size", "32", "--trainer.max_epochs", "2",
       "--model.optimizer.lr", "0.0003", "--trainer.accelerator", "cpu",
       "--trainer.strategy", "ddp"]

pytestmark = pytest.mark.slow  # several processes each: seconds


def weights(run):
    """The weights in a run's last.ckpt."""
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """`python train.py ... --trainer.devices 2` in a terminal, nothing stopped: its folder (with
    the data), its exit code and what the terminal showed."""
    cwd = tmp_path_factory.mktemp("two_processes")
    data = write_mnist(cwd / "data")
    code, output = run_in_terminal(
        [*FIT, "--trainer.devices", "2", "--data.data_dir", str(data),
         "--trainer.callbacks+=probes.SaveWeights"], cwd=cwd, env=PROBES)
    return cwd, code, output


def test_two_process_ddp_trains_identical_replicas_and_counts_the_test_set_once(
        two_processes, capsys):
    cwd, code, output = two_processes
    assert code == 0 and "Traceback" not in output, output[-3000:]
    assert "ImageClassifier(mlp) on mnist: test/acc" in output
    zero, one = (torch.load(cwd / f"weights-rank{r}.pt", weights_only=True) for r in (0, 1))
    assert all(torch.equal(zero[k], one[k]) for k in zero)
    (run,) = runs(cwd)
    record = results(run)
    assert record["global_step"] == 16 and 0.2 < record["metrics"]["test/acc"] < 1
    # The same checkpoint tested by one process: every test image counted once.
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert run_train(["test", "--ckpt_path", str(run)]) == 0
    alone = results(next((run / "test").rglob("version_0")))["metrics"]
    assert alone["test/acc"] == record["metrics"]["test/acc"]
    assert alone["test/loss"] == pytest.approx(record["metrics"]["test/loss"], rel=1e-6)


def free_port() -> int:
    """A TCP port on localhost that no one listens on now: the rendezvous's."""
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
                   "--master_port", str(port), TRAIN, *args, *QUIET]
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


def test_sigterm_to_one_node_stops_both_with_a_checkpoint_and_going_on_ends_as_an_unbroken_fit(
        two_processes, tmp_path):
    assert two_processes[1] == 0, two_processes[2][-3000:]  # the unbroken fit to compare with
    straight = runs(two_processes[0])[0]
    args = [*FIT, "--trainer.num_nodes", "2", "--trainer.devices", "1", "--data.data_dir",
            str(two_processes[0] / "data")]
    # Node 1's worker sends SIGTERM to its torchrun after step 5, which passes it on to that node's
    # worker only: the processes agree to stop at the next step's end.
    stop = ["--trainer.callbacks+=probes.SignalAt", "--trainer.callbacks.step=5",
            "--trainer.callbacks.rank=1", "--trainer.callbacks.parent=true"]
    nodes = two_nodes(args + stop, tmp_path)
    saved = []
    for code, output in nodes:  # each node's worker stops at the same step, and says where it saved
        assert code != 0
        saved += re.findall(r"train\.py: stopped by SIGTERM in epoch 0 at step \d+; saved (\S+): "
                            r"add --ckpt_path \1 to the same command to go on", output)
    assert len(saved) == 2 and saved[0] == saved[1], [output[-3000:] for _, output in nodes]
    assert torch.load(saved[0], weights_only=True)["global_step"] >= 5
    (run,) = runs(tmp_path)
    assert results(run)["status"] == "stopped by SIGTERM"
    for code, output in two_nodes(args + ["--trainer.callbacks+=probes.SaveWeights",
                                          "--ckpt_path", saved[0]], tmp_path):
        assert code == 0, output[-3000:]
    assert runs(tmp_path) == [run]  # it went on in its own folder
    assert ([(tmp_path / f"environment-rank{r}.txt").read_text() for r in (0, 1)]
            == ["TorchElasticEnvironment"] * 2)
    mine, theirs = results(run), results(straight)
    assert mine["global_step"] == theirs["global_step"] == 16
    assert mine["metrics"]["test/acc"] == theirs["metrics"]["test/acc"]
    ours, straights = weights(run), weights(straight)
    assert all(torch.equal(ours[k], straights[k]) for k in straights)
