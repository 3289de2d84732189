"""Two processes under DDP on the CPU (gloo), as a user starts them at a terminal: progress bars on."""

import json

import pytest
from helpers import ROOT, results, run_dirs, run_in_terminal


@pytest.mark.slow
def test_two_process_ddp_on_cpu_with_the_progress_bar(mnist_dir, tmp_path):
    probe = json.dumps({"class_path": "probes.SaveWeights", "init_args": {"out_dir": str(tmp_path / "weights")}})
    code, screen = run_in_terminal(["--model", "mlp", "--data.data_dir", str(mnist_dir), "--data.val_size=100",
                                    "--data.batch_size=50", "--trainer.max_epochs=2", "--trainer.accelerator=cpu",
                                    "--trainer.devices=2", "--trainer.strategy=ddp", f"--trainer.callbacks+={probe}"],
                                   cwd=tmp_path, env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}, timeout=300)
    assert code == 0, screen[-3000:]
    assert "Epoch 1: 100%" in screen and "train/loss=" in screen  # the bars were drawn, with the metrics
    assert "Traceback" not in screen
    ranks = [json.loads((tmp_path / "weights" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world_size"] == ranks[1]["world_size"] == 2
    assert ranks[0]["train_batches"] == ranks[1]["train_batches"] == 500 // 2 // 50  # each rank its half
    assert ranks[0]["global_step"] == 2 * 5  # optimizer steps, in one call of 5 an epoch
    assert ranks[0]["weights"] == ranks[1]["weights"]  # gradients were all-reduced every step
    (run,) = run_dirs(tmp_path)  # one run directory, written by rank 0
    res = results(run)
    assert res["test_samples"] == 200  # the whole test set, each image once across both ranks
    assert res["world_size"] == 2 and res["effective_batch_size"] == 100 and res["lr_scaling"] == "none"
    assert "2 processes x 1 accumulated x batch 50 = effective batch 100" in screen
