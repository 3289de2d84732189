"""Bad input: one clear message, a non-zero exit, no traceback, and nothing a user had is touched."""

import json

import pytest
import torch
from helpers import finished_mnist_run, run_dirs, run_inprocess

SMALL = ["--model", "mlp", "--data.val_size=100", "--data.batch_size=50", "--trainer.max_epochs=1"]


def tree(path):
    """Every file under path with its bytes, to show that nothing changed."""
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """A folder holding data and one finished run (lightning_logs/version_0), shared by these tests."""
    return finished_mnist_run(tmp_path_factory.mktemp("earlier"), SMALL)


@pytest.fixture
def in_earlier(earlier, monkeypatch):
    """Run in that folder; afterwards, check that nothing in it changed."""
    monkeypatch.chdir(earlier.cwd)
    before = tree(earlier.cwd)
    yield earlier
    assert tree(earlier.cwd) == before


def fails(args, capsys, code, *phrases):
    """Run train.py in this process: it must exit with `code` and say each phrase on stderr."""
    assert run_inprocess(args) == code
    err = capsys.readouterr().err
    for phrase in phrases:
        assert phrase in err, (phrase, err[-2000:])


@pytest.mark.parametrize("args, phrases", [
    (["--config", "missing.yaml"], ["missing.yaml"]),
    (["--data.batch_size", "0"], ["batch_size"]),
    (["--model.lr", "-0.1"], ["lr"]),
    (["--trainer.max_epochs", "many"], ["max_epochs"]),
], ids=["config-missing", "batch-size-zero", "lr-negative", "epochs-not-a-number"])
def test_bad_arguments_exit_2(args, phrases, in_earlier, capsys):
    fails(["--model", "mlp", "--data.data_dir", str(in_earlier.data), *args], capsys, 2, *phrases)


def test_malformed_config_exits_2(in_earlier, tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("model: {class_path: lit_models.ImageClassifier\ntrainer: [\n")
    fails(["--config", str(tmp_path / "bad.yaml")], capsys, 2, "bad.yaml", "not valid YAML (line 2")


def test_data_dir_that_cannot_be_created(in_tmp, capsys):
    (in_tmp / "a_file").write_text("not a folder")
    fails([*SMALL, "--data.data_dir", str(in_tmp / "a_file" / "data")], capsys, 1, "--data.data_dir",
          "cannot be created")


def test_truncated_data_file_is_named(mnist_dir, in_tmp, capsys):
    images = mnist_dir / "MNIST" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:5000])
    fails([*SMALL, "--data.data_dir", str(mnist_dir)], capsys, 1, str(images), "truncated or corrupt")
    assert images.stat().st_size == 5000  # left as it was


@pytest.mark.parametrize("problem", ["missing", "truncated", "other-model", "no-last"])
def test_bad_checkpoints(problem, in_earlier, tmp_path, capsys):
    last = in_earlier.run / "checkpoints" / "last.ckpt"
    args = [*SMALL, "--data.data_dir", str(in_earlier.data), "--ckpt_path", str(last)]
    if problem == "missing":
        args[-1], phrase = str(tmp_path / "nope.ckpt"), "does not exist"
    elif problem == "truncated":
        broken = tmp_path / "broken.ckpt"
        broken.write_bytes(last.read_bytes()[:3000])
        args[-1], phrase = str(broken), "may be truncated"
    elif problem == "other-model":
        args[1], phrase = "cnn", "from another model (mlp"
        args += ["--data", "mnist"]
    else:
        args[-1], phrase = "last", "no run in"
        args += ["--trainer.logger.init_args.save_dir", str(tmp_path / "elsewhere")]
    fails(args, capsys, 1, phrase)


@pytest.mark.parametrize("steps_per_call, poisoned", [(1, 13), (8, 18)])
def test_nan_loss_stops_naming_epoch_and_step_and_keeps_the_last_good_checkpoint(steps_per_call, poisoned, mnist_dir,
                                                                                 in_tmp, capsys):
    # 10 steps an epoch; in chunks of 8 the first call to reach step 13 ends at step 18
    probe = json.dumps({"class_path": "probes.NanLossAtStep", "init_args": {"step": 13}})
    fails([*SMALL, "--trainer.max_epochs=3", "--data.data_dir", str(mnist_dir), f"--trainer.callbacks+={probe}",
           f"--data.steps_per_call={steps_per_call}"], capsys, 1, f"NaN or infinite at epoch 1, step {poisoned};")
    (run,) = run_dirs(in_tmp)
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 10  # the end of epoch 0, not overwritten by broken weights
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())


def test_an_earlier_runs_directory_is_never_reused(earlier, monkeypatch, capsys):
    monkeypatch.chdir(earlier.cwd)
    before = tree(earlier.run)
    fails([*SMALL, "--data.data_dir", str(earlier.data), "--trainer.logger.init_args.version", "version_0"],
          capsys, 1, "holds an earlier run")
    assert run_inprocess([*SMALL, "--data.data_dir", str(earlier.data)]) == 0
    assert [d.name for d in run_dirs(earlier.cwd)] == ["version_0", "version_1"]
    assert tree(earlier.run) == before


def test_gpu_out_of_memory_suggests_what_to_change(monkeypatch, capsys):
    from cli import main as cli_main

    def out_of_memory(argv):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(cli_main, "run", out_of_memory)
    assert cli_main.main(["--model", "cnn"]) == 1
    err = capsys.readouterr().err
    assert "ran out of memory" in err and "--data.batch_size" in err and "--data.on_device false" in err
    with pytest.raises(torch.cuda.OutOfMemoryError):
        cli_main.main(["--model", "cnn", "--verbose"])  # the traceback, when asked for


def test_unknown_name_in_process_returns_2(in_tmp, capsys):
    fails(["--model", "vit"], capsys, 2, "choose one of: cnn, mlp")
