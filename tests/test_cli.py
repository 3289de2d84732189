"""train.py as a user runs it: fit + test, what a run writes, overrides, configs, records, and bad names."""

import pytest
import torch
import yaml
from helpers import ROOT, results, run_dirs, run_inprocess, run_subprocess, scalars

MNIST_SMALL = ["--data.val_size=100", "--data.eval_batch_size=64", "--trainer.accelerator=cpu"]
EPOCH_METRICS = ["train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best"]


def test_mlp_fit_test_writes_logs_checkpoints_config_results(mnist_dir, tmp_path):
    proc = run_subprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL,
                           "--trainer.max_epochs", "3", "--data.batch_size", "50"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    assert run.relative_to(tmp_path).parts == ("lightning_logs", "mlp-mnist", "version_0")  # named by model and data
    res = results(run)
    for key in ["stage", "model", "data", "epochs", "fit_seconds", "test/acc", "test/loss", "test_samples",
                "val/acc_best", "device", "precision", "optimizer", "lr", "scheduler", "steps_per_call"]:
        assert key in res, key
    assert (res["stage"], res["model"], res["data"], res["epochs"]) == ("fit", "mlp", "mnist", 3)
    assert res["test_samples"] == 200  # every test image, exactly once
    assert res["device"] == "cpu" and res["precision"] == "32-true"
    assert res["tf32"] is False and res["cudnn_benchmark"] is True  # GPU settings, reported
    assert (res["optimizer"], res["lr"], res["scheduler"]) == ("AdamW", 0.015, "OneCycle")  # the recipe's
    assert res["steps_per_call"] == 8 and res["global_step"] == 30  # 10 optimizer steps an epoch, in chunks of 8
    assert res["test/acc"] > 0.6  # learnable data: chance is 0.1
    tags = scalars(run)
    for tag in EPOCH_METRICS:
        assert len(tags[tag]) == 3, tag  # once per epoch
    assert tags["val/acc_best"] == [max(tags["val/acc"][: i + 1]) for i in range(3)]
    assert tags["test/acc"] == [pytest.approx(res["test/acc"])]
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "last.ckpt" in ckpts and any(n.startswith("epoch") for n in ckpts)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["arch"] == "mlp"
    assert config["data"]["class_path"] == "datamodules.MNISTDataModule"
    # what the user asked for, so that a replay elsewhere resolves it there: no device precision, no absolute path
    assert config["trainer"]["precision"] is None
    assert config["trainer"]["logger"]["init_args"]["save_dir"] == "lightning_logs"
    assert "mlp on mnist: test/acc" in proc.stdout
    assert "Accuracy for class:" in proc.stdout


def test_cnn_on_cifar10_reads_the_pickle_batches(cifar10_dir, in_tmp):
    code = run_inprocess(["--model", "cnn", "--data.data_dir", str(cifar10_dir), "--data.val_size=100",
                          "--trainer.max_epochs=4", "--data.batch_size=20", "--trainer.accelerator=cpu"])
    assert code == 0
    (run,) = run_dirs(in_tmp)
    res = results(run)
    assert (res["model"], res["data"], res["test_samples"]) == ("cnn", "cifar10", 200)
    assert res["test/acc"] > 0.3
    assert res["channels_last"] is True
    # the tutorial network, exactly: conv 3->6->16, fc 400->120->84->10
    state = torch.load(res["checkpoint"], weights_only=True)["state_dict"]
    assert state["net.conv1.weight"].shape == (6, 3, 5, 5)
    assert state["net.fc1.weight"].shape == (120, 400)
    assert state["net.fc3.weight"].shape == (10, 84)


@pytest.mark.parametrize("model, data, fc1_inputs", [("cnn", "mnist", 16 * 4 * 4), ("mlp", "cifar10", 3072)])
def test_any_model_runs_on_any_data(model, data, fc1_inputs, mnist_dir, cifar10_dir, in_tmp):
    data_dir = mnist_dir if data == "mnist" else cifar10_dir
    assert run_inprocess(["--model", model, "--data", data, "--data.data_dir", str(data_dir),
                          "--data.val_size=100", "--trainer.max_epochs=1", "--data.batch_size=50"]) == 0
    (run,) = run_dirs(in_tmp)
    res = results(run)
    assert (res["model"], res["data"]) == (model, data)
    state = torch.load(res["checkpoint"], weights_only=True)["state_dict"]
    assert state["net.fc1.weight"].shape[1] == fc1_inputs
    hp = torch.load(res["checkpoint"], weights_only=True)["datamodule_hyper_parameters"]
    # augmentation is the data set's own: the CNN recipe brings no CIFAR-10 flips to digits, CIFAR-10 keeps them
    assert (hp["crop_padding"], hp["flip"]) == ((0, False) if data == "mnist" else (4, True))


def test_overrides_change_what_runs(mnist_dir, in_tmp):
    code = run_inprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL,
                          "--trainer.max_epochs", "2", "--data.batch_size", "100", "--model.optimizer.lr", "0.01"])
    assert code == 0
    (run,) = run_dirs(in_tmp)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.01
    assert config["data"]["init_args"]["batch_size"] == 100
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 2 * (500 // 100)  # 500 training images
    assert ckpt["hyper_parameters"]["optimizer"]["init_args"]["lr"] == 0.01
    assert ckpt["optimizer_states"][0]["param_groups"][0]["max_lr"] == 0.01  # OneCycle peaks at the optimizer's lr


def test_records_show_the_optimizer_that_ran(mnist_dir, in_tmp):
    code = run_inprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL, "--trainer.max_epochs=1",
                          "--data.batch_size=50", "--model.optimizer", "Adam", "--model.optimizer.lr", "0.002",
                          "--model.scheduler", "null"])
    assert code == 0
    (run,) = run_dirs(in_tmp)
    res = results(run)
    assert (res["optimizer"], res["lr"], res["scheduler"]) == ("Adam", 0.002, None)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["optimizer"]["class_path"] == "torch.optim.Adam"
    assert ckpt["hyper_parameters"]["optimizer"]["init_args"]["lr"] == 0.002
    (state,) = ckpt["optimizer_states"]
    assert state["param_groups"][0]["lr"] == 0.002 and "betas" in state["param_groups"][0]  # Adam, constant
    assert ckpt["lr_schedulers"] == []


def test_print_config_round_trips_through_config(mnist_dir, in_tmp, capsys):
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL, "--trainer.max_epochs=1",
            "--model.optimizer.weight_decay=0.01", "--data.batch_size=50"]
    assert run_inprocess(args + ["--print_config"]) == 0
    printed = capsys.readouterr().out
    (in_tmp / "my.yaml").write_text(printed)
    assert not run_dirs(in_tmp)  # printing trains nothing
    assert run_inprocess(["--config", "my.yaml"]) == 0
    saved = (run_dirs(in_tmp)[0] / "config.yaml").read_text()
    assert yaml.safe_load(saved)["model"] == yaml.safe_load(printed)["model"]
    assert yaml.safe_load(saved)["model"]["init_args"]["optimizer"]["init_args"]["weight_decay"] == 0.01


@pytest.mark.parametrize("config, batch, epochs, optimizer, lr, mean", [
    ("tutorial_cnn.yaml", 4, 2, "torch.optim.SGD", 0.001, [0.5] * 3),
    ("tutorial_mlp.yaml", 64, 10, "torch.optim.Adam", 0.001, [0.5])])
def test_tutorial_configs_hold_the_tutorials_settings(config, batch, epochs, optimizer, lr, mean, in_tmp, capsys):
    assert run_inprocess(["--config", str(ROOT / "configs" / config), "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    data, model = printed["data"]["init_args"], printed["model"]["init_args"]
    assert data["batch_size"] == batch and printed["trainer"]["max_epochs"] == epochs
    assert model["optimizer"]["class_path"] == optimizer and model["optimizer"]["init_args"]["lr"] == lr
    assert model["scheduler"] is None and model["label_smoothing"] == 0.0  # constant rate, plain cross-entropy
    assert data["val_size"] == 0 and data["mean"] == mean and data["std"] == mean  # all training images; 0.5/0.5
    assert (data["crop_padding"], data["flip"]) == (0, False)
    if config == "tutorial_cnn.yaml":
        assert model["optimizer"]["init_args"]["momentum"] == 0.9


def test_a_run_without_validation_trains_on_everything_and_tests_the_last_checkpoint(mnist_dir, in_tmp):
    code = run_inprocess(["--config", str(ROOT / "configs" / "tutorial_mlp.yaml"), "--data.data_dir", str(mnist_dir),
                          "--trainer.max_epochs=2", "--trainer.accelerator=cpu"])
    assert code == 0
    (run,) = run_dirs(in_tmp)
    res = results(run)
    assert res["checkpoint"].endswith("last.ckpt") and res["val/acc_best"] is None
    assert res["global_step"] == 2 * (600 // 64)  # every one of the 600 training images, batches of 64
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]
    assert "val/acc" not in scalars(run) and res["test/acc"] > 0.5


@pytest.mark.parametrize("flag, value, choices", [("--model", "resnet", "cnn, mlp"),
                                                  ("--data", "imagenet", "cifar10, mnist, fashion_mnist")])
def test_unknown_names_exit_2_and_list_choices(flag, value, choices, tmp_path):
    proc = run_subprocess([flag, value], cwd=tmp_path)
    assert proc.returncode == 2
    assert f"unknown {flag} '{value}'" in proc.stderr and choices in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "lightning_logs").exists()


def test_missing_data_offline_names_the_directory_and_files(tmp_path):
    # A proxy that refuses connections: torchvision's real download code runs and fails, offline.
    env = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    proc = run_subprocess(["--model", "mlp", "--data.data_dir", str(tmp_path / "nodata")], cwd=tmp_path, env=env)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert str(tmp_path / "nodata" / "MNIST" / "raw") in message
    assert "train-images-idx3-ubyte.gz" in message and "t10k-labels-idx1-ubyte.gz" in message
    assert not (tmp_path / "lightning_logs").exists() or not run_dirs(tmp_path)  # no empty run left behind


def test_same_seed_same_numbers_and_a_random_seed_is_recorded_and_replays(mnist_dir, in_tmp):
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL, "--trainer.max_epochs=1",
            "--data.batch_size=50", "--data.crop_padding=2", "--data.flip=true"]
    assert run_inprocess(args) == 0 and run_inprocess(args) == 0
    first, second = (results(r) for r in run_dirs(in_tmp))
    assert first["test/loss"] == second["test/loss"] and first["val/acc_best"] == second["val/acc_best"]
    assert run_inprocess(args + ["--seed_everything=1"]) == 0
    assert results(run_dirs(in_tmp)[2])["test/loss"] != first["test/loss"]
    assert run_inprocess(args + ["--seed_everything=true"]) == 0
    drawn = run_dirs(in_tmp)[3]
    seed = results(drawn)["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**32
    assert yaml.safe_load((drawn / "config.yaml").read_text())["seed_everything"] == seed
    assert run_inprocess(["--config", str(drawn / "config.yaml")]) == 0  # the saved config replays the run
    assert results(run_dirs(in_tmp)[4])["test/loss"] == results(drawn)["test/loss"]


@pytest.mark.slow
def test_compile_trains_the_same_network(mnist_dir, in_tmp):
    code = run_inprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL,
                          "--trainer.max_epochs=1", "--data.batch_size=50", "--model.compile=true"])
    assert code == 0
    res = results(run_dirs(in_tmp)[0])
    assert res["compile"] is True and res["test/acc"] > 0.5
    state = torch.load(res["checkpoint"], weights_only=True)["state_dict"]
    assert "net.fc1.weight" in state  # the same keys as without compile: checkpoints interchange


@pytest.mark.parametrize("flag, expected", [([], True), (["--tf32=false"], False)])
def test_tf32_flag_sets_both_kinds_of_kernels_on_a_gpu(flag, expected, mnist_dir, in_tmp, monkeypatch):
    # No GPU here: pretend one is there for the CLI's settings, and build the Trainer on the CPU.
    from cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not expected
    try:
        _, _, trainer, run = app.build("fit", ["--config", str(ROOT / "configs" / "mlp.yaml"), "--data.data_dir",
                                               str(mnist_dir), "--trainer.accelerator=cpu", *flag])
        assert torch.backends.cuda.matmul.allow_tf32 is expected and torch.backends.cudnn.allow_tf32 is expected
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert trainer.precision == "32-true"  # bf16 only where the Trainer's device is the GPU
    assert not (run.dir / "config.yaml").exists()  # saved once training starts, not when the Trainer is built


def test_help_shows_the_recipes_options_first(capsys, in_tmp):
    assert run_inprocess(["--model", "mlp", "--help"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[:40]
    assert any(line.startswith("  --model.optimizer AdamW") for line in head)
    assert any(line.startswith("    --model.optimizer.lr 0.015") for line in head)
    assert any(line.startswith("  --data.batch_size 1536") for line in out.splitlines()[:60])
    assert "--trainer.max_epochs 30" in out and "predict" in out
    assert run_inprocess(["--data.help", "cifar10"], quiet=False) == 0  # short names wherever a class name goes
    assert "--data.crop_padding" in capsys.readouterr().out


def test_a_run_not_in_a_terminal_prints_one_plain_line_per_epoch(mnist_dir, tmp_path):
    proc = run_subprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL, "--trainer.max_epochs=3",
                           "--data.batch_size=50"], cwd=tmp_path, quiet=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("Epoch ")]
    assert [line.split(":")[0] for line in lines] == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]
    assert all("train/loss=" in line and "val/acc=" in line for line in lines)
    assert "\r" not in proc.stdout and "it/s" not in proc.stdout + proc.stderr  # no bars redrawn into the log
