"""train.py as a user runs it: fit + test, what a run writes, overrides, configs, and bad names."""

import pytest
import torch
import yaml
from helpers import results, run_dirs, run_inprocess, run_subprocess, scalars

MNIST_SMALL = ["--data.val_size=100", "--data.eval_batch_size=64"]
EPOCH_METRICS = ["train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best"]


def test_mlp_fit_test_writes_logs_checkpoints_config_results(mnist_dir, tmp_path):
    proc = run_subprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL,
                           "--trainer.max_epochs", "3", "--data.batch_size", "50"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    res = results(run)
    for key in ["model", "data", "epochs", "fit_seconds", "test/acc", "test/loss", "test_samples",
                "val/acc_best", "device", "precision"]:
        assert key in res, key
    assert (res["model"], res["data"], res["epochs"]) == ("mlp", "mnist", 3)
    assert res["test_samples"] == 200  # every test image, exactly once
    assert res["device"] == "cpu" and res["precision"] == "32-true"
    assert res["tf32"] is False and res["cudnn_benchmark"] is True  # GPU settings, reported
    assert res["test/acc"] > 0.6  # learnable data: chance is 0.1
    tags = scalars(run)
    for tag in EPOCH_METRICS:
        assert len(tags[tag]) == 3, tag  # once per epoch
    assert tags["val/acc_best"] == [max(tags["val/acc"][: i + 1]) for i in range(3)]
    assert tags["test/acc"] == [pytest.approx(res["test/acc"])]
    assert tags["test/loss"] == [pytest.approx(res["test/loss"])]
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "last.ckpt" in ckpts and any(n.startswith("epoch") for n in ckpts)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["arch"] == "mlp"
    assert config["data"]["class_path"] == "datamodules.MNISTDataModule"
    assert "mlp on mnist: test/acc" in proc.stdout
    assert "Accuracy for class:" in proc.stdout


def test_cnn_on_cifar10_reads_the_pickle_batches(cifar10_dir, in_tmp):
    code = run_inprocess(["--model", "cnn", "--data.data_dir", str(cifar10_dir), "--data.val_size=100",
                          "--trainer.max_epochs=4", "--data.batch_size=20"])
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
    res = results(run_dirs(in_tmp)[0])
    assert (res["model"], res["data"]) == (model, data)
    state = torch.load(res["checkpoint"], weights_only=True)["state_dict"]
    assert state["net.fc1.weight"].shape[1] == fc1_inputs


def test_overrides_change_what_runs(mnist_dir, in_tmp):
    code = run_inprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL,
                          "--trainer.max_epochs", "2", "--data.batch_size", "100", "--model.lr", "0.01"])
    assert code == 0
    run = run_dirs(in_tmp)[0]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["init_args"]["lr"] == 0.01
    assert config["data"]["init_args"]["batch_size"] == 100
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 2 * (500 // 100)  # 500 training images
    assert ckpt["hyper_parameters"]["lr"] == 0.01


def test_print_config_round_trips_through_config(mnist_dir, in_tmp, capsys):
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL, "--trainer.max_epochs=1",
            "--model.weight_decay=0.01", "--data.batch_size=50"]
    assert run_inprocess(args + ["--print_config"]) == 0
    printed = capsys.readouterr().out
    (in_tmp / "my.yaml").write_text(printed)
    assert not run_dirs(in_tmp)  # printing trains nothing
    assert run_inprocess(["--config", "my.yaml"]) == 0
    saved = (run_dirs(in_tmp)[0] / "config.yaml").read_text()
    assert yaml.safe_load(saved)["model"] == yaml.safe_load(printed)["model"]
    assert yaml.safe_load(saved)["model"]["init_args"]["weight_decay"] == 0.01


@pytest.mark.parametrize("config, batch, epochs, optimizer, lr", [
    ("seed_cnn.yaml", 4, 2, "torch.optim.SGD", 0.001), ("seed_mlp.yaml", 64, 10, "torch.optim.Adam", 0.001)])
def test_seed_configs_hold_the_tutorials_settings(config, batch, epochs, optimizer, lr, in_tmp, capsys):
    from helpers import ROOT

    assert run_inprocess(["--config", str(ROOT / "configs" / config), "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["init_args"]["batch_size"] == batch
    assert printed["trainer"]["max_epochs"] == epochs
    assert printed["optimizer"]["class_path"] == optimizer
    assert printed["optimizer"]["init_args"]["lr"] == lr
    if config == "seed_cnn.yaml":
        assert printed["optimizer"]["init_args"]["momentum"] == 0.9


def test_seed_optimizer_replaces_the_recipe(mnist_dir, in_tmp):
    from helpers import ROOT

    code = run_inprocess(["--config", str(ROOT / "configs" / "seed_mlp.yaml"), "--data.data_dir",
                          str(mnist_dir), *MNIST_SMALL, "--trainer.max_epochs=1", "--data.batch_size=50"])
    assert code == 0
    ckpt = torch.load(run_dirs(in_tmp)[0] / "checkpoints" / "last.ckpt", weights_only=False)
    (opt,) = ckpt["optimizer_states"]
    assert opt["param_groups"][0]["lr"] == 0.001 and "betas" in opt["param_groups"][0]  # Adam, constant
    assert ckpt["lr_schedulers"] == []


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


def test_same_seed_same_numbers(mnist_dir, in_tmp):
    args = ["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL, "--trainer.max_epochs=1",
            "--data.batch_size=50"]
    assert run_inprocess(args) == 0 and run_inprocess(args) == 0
    first, second = (results(r) for r in run_dirs(in_tmp))
    assert first["test/loss"] == second["test/loss"] and first["val/acc_best"] == second["val/acc_best"]
    assert run_inprocess(args + ["--seed_everything=1"]) == 0
    assert results(run_dirs(in_tmp)[2])["test/loss"] != first["test/loss"]


@pytest.mark.slow
def test_compile_trains_the_same_network(mnist_dir, in_tmp):
    code = run_inprocess(["--model", "mlp", "--data.data_dir", str(mnist_dir), *MNIST_SMALL,
                          "--trainer.max_epochs=1", "--data.batch_size=50", "--model.compile=true"])
    assert code == 0
    res = results(run_dirs(in_tmp)[0])
    assert res["compile"] is True and res["test/acc"] > 0.5
    state = torch.load(res["checkpoint"], weights_only=True)["state_dict"]
    assert "net.fc1.weight" in state  # the same keys as without compile: checkpoints interchange
