"""K optimizer steps per Lightning step (--data.steps_per_call): the same training as one step per call."""

import pytest
import torch
from helpers import results, run_dirs, run_inprocess, scalars

MLP = ["--model", "mlp", "--data.val_size=100", "--data.eval_batch_size=100", "--data.batch_size=50",
       "--trainer.accelerator=cpu", "--data.crop_padding=2", "--data.flip=true"]  # augmentation on


def last_weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def identical(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_any_steps_per_call_ends_with_identical_weights(model, mnist_dir, cifar10_dir, in_tmp):
    data = ["--data.data_dir", str(mnist_dir)] if model == "mlp" else \
        ["--model", "cnn", "--data.data_dir", str(cifar10_dir), "--data.val_size=100", "--data.batch_size=40",
         "--trainer.accelerator=cpu"]
    args = [*MLP, *data, "--trainer.max_epochs=2"]
    for k in (1, 8, 3):
        assert run_inprocess([*args, f"--data.steps_per_call={k}"]) == 0
    one, eight, three = (last_weights(r) for r in run_dirs(in_tmp))
    assert identical(one, eight) and identical(one, three)
    assert [results(r)["steps_per_call"] for r in run_dirs(in_tmp)] == [1, 8, 3]
    assert len({results(r)["global_step"] for r in run_dirs(in_tmp)}) == 1  # global_step counts optimizer steps


def test_accumulation_is_the_same_whatever_the_chunks(mnist_dir, in_tmp):
    args = [*MLP, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=2", "--trainer.accumulate_grad_batches=3"]
    for k in (1, 8):
        assert run_inprocess([*args, f"--data.steps_per_call={k}"]) == 0
    runs = run_dirs(in_tmp)
    assert identical(*(last_weights(r) for r in runs))
    # 10 batches an epoch in groups of 3 (the last of 1): 4 optimizer steps an epoch; chunks of 8 rounded up to 9
    assert [results(r)["global_step"] for r in runs] == [8, 8]
    assert [results(r)["steps_per_call"] for r in runs] == [3, 9]
    assert results(runs[0])["effective_batch_size"] == 150


def test_limits_count_batches_and_optimizer_steps(mnist_dir, in_tmp):
    base = [*MLP, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=3"]
    assert run_inprocess([*base, "--trainer.limit_train_batches=3"]) == 0
    assert run_inprocess([*base, "--trainer.limit_train_batches=0.5"]) == 0
    assert run_inprocess([*base, "--trainer.max_steps=13"]) == 0
    by_count, by_fraction, by_steps = (results(r) for r in run_dirs(in_tmp))
    assert by_count["global_step"] == 3 * 3  # 3 batches an epoch, not 3 calls
    assert by_fraction["global_step"] == 3 * 5  # half of the 10, once
    assert by_steps["global_step"] == 13 and by_steps["epochs"] == 2  # stops inside a chunk of epoch 1, at step 13


def test_learning_rates_are_logged_per_optimizer_step(mnist_dir, in_tmp):
    assert run_inprocess([*MLP, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=3",
                          "--trainer.log_every_n_steps=4", "--trainer.enable_progress_bar=false"]) == 0
    (run,) = run_dirs(in_tmp)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("lr-AdamW")]
    assert steps == list(range(0, 30, 4))  # every 4th optimizer step, not every call of 8
    lrs = scalars(run)["lr-AdamW"]
    assert lrs[0] == pytest.approx(0.015 / 25) and max(lrs) > lrs[0] > lrs[-1] * 0  # OneCycle: warm up, anneal
    # the epoch metrics are plotted against optimizer steps too: the end of each epoch of 10 steps
    assert [e.step for e in acc.Scalars("train/loss")] == [9, 19, 29]


@pytest.mark.parametrize("precision, dtype", [("64-true", torch.float64), ("bf16-true", torch.bfloat16)])
def test_a_true_precision_trains_in_its_type(precision, dtype, mnist_dir, in_tmp):
    # Lightning converts a batch's inputs for 64-true and bf16-true, but not the example input of the model
    # summary and the TensorBoard graph; and a chunk's batches are made in the step.
    args = [*MLP, "--data.data_dir", str(mnist_dir), "--trainer.max_epochs=2", "--trainer.accelerator=cpu",
            f"--trainer.precision={precision}"]
    assert run_inprocess(args) == 0
    run = run_dirs(in_tmp)[0]
    assert results(run)["precision"] == precision and results(run)["test/acc"] > 0.3
    assert all(w.dtype == dtype for w in last_weights(run).values() if w.is_floating_point())
