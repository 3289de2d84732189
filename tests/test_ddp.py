"""DDP as the README shows it: two processes on the CPU (gloo), in a terminal with the default
progress bar."""

import json

import pytest
import torch
from conftest import ROOT, run_in_terminal, run_process, runs


@pytest.mark.slow
def test_two_process_ddp_trains_identical_replicas_and_counts_the_test_set_once(
    mnist_dir, tmp_path
):
    code, output = run_in_terminal(
        [
            "--model",
            "mlp",
            "--data.data_dir",
            str(mnist_dir),
            "--data.batch_size",
            "32",
            "--trainer.max_epochs",
            "2",
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            "2",
            "--trainer.strategy",
            "ddp",
            "--trainer.callbacks+=probes.SaveWeights",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
    )
    assert code == 0, output[-3000:]
    assert "Traceback" not in output and "ImageClassifier(mlp) on mnist: test/acc" in output
    zero, one = (torch.load(tmp_path / f"weights-rank{r}.pt", weights_only=True) for r in (0, 1))
    assert all(torch.equal(zero[k], one[k]) for k in zero)
    record = json.loads((runs(tmp_path)[0] / "results.json").read_text())
    assert record["global_step"] == 2 * (540 // 2 // 32)  # each process its half of the images
    alone = run_process(
        ["test", "--ckpt_path", record["checkpoint"]],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
    )
    assert alone.returncode == 0 and f"test/acc {record['test/acc']:.4f}" in alone.stdout
