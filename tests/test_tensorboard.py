"""What `tensorboard --logdir lightning_logs` shows after a run, read back with TensorBoard's own code."""

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest
from helpers import results, run_dirs, run_subprocess, scalars
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One Fashion-MNIST-format run of 3 epochs: its run directory and what it printed."""
    from conftest import write_mnist

    cwd = tmp_path_factory.mktemp("tb")
    data = write_mnist(cwd / "data", folder="FashionMNIST")
    proc = run_subprocess(["--model", "mlp", "--data", "fashion_mnist", "--data.data_dir", str(data),
                           "--data.val_size=100", "--data.batch_size=50", "--trainer.max_epochs=3",
                           "--trainer.log_every_n_steps=5", "--trainer.accelerator=cpu"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = run_dirs(cwd)
    return SimpleNamespace(dir=run_dir, stdout=proc.stdout)


def accumulator(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars(run):
    tags = scalars(run.dir)
    for tag in ["train/loss", "train/acc", "val/loss", "val/acc", "val/acc_best", "train/epoch_seconds",
                "train/images_per_second"]:
        assert len(tags[tag]) == 3, tag  # one a epoch
    assert all(v > 0 for v in tags["train/images_per_second"])
    assert len(tags["lr-AdamW"]) >= 5  # logged every 5 steps: the OneCycle curve
    lrs = tags["lr-AdamW"]
    assert max(lrs) > lrs[0] and lrs[-1] < max(lrs)  # it warms up, then anneals
    assert tags["test/acc"] == [pytest.approx(results(run.dir)["test/acc"])]
    assert "gpu/peak_memory_gb" not in tags  # a CPU run


def test_per_class_accuracies_weighted_by_class_size_give_the_accuracy(run):
    from conftest import class_images

    _, labels = class_images(800, 1, 28, seed=1)  # the fixture's images: the last 200 are the test set
    counts = [int((labels[600:] == k).sum()) for k in range(10)]
    assert len(set(counts)) > 1  # an unbalanced test set, so that a plain mean of the classes would differ
    tags = scalars(run.dir)
    per_class = [tags[f"test/acc_class/{name}"][0] for name in CLASSES]
    assert sum(a * n for a, n in zip(per_class, counts)) / 200 == pytest.approx(tags["test/acc"][0], abs=1e-6)
    assert "Accuracy for class: Ankle boot" in run.stdout


def test_hparams_tab_has_the_run_settings_and_real_metrics(run):
    acc = accumulator(run.dir)
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert {"val/acc_best", "test/acc"} <= metrics and "hp_metric" not in metrics
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hp = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    assert hp["model"] == "mlp" and hp["data"] == "fashion_mnist" and hp["optimizer"] == "AdamW"
    assert hp["lr"] == pytest.approx(0.015) and hp["batch_size"] == 50 and hp["max_epochs"] == 3
    assert hp["precision"] == "32-true" and hp["schedule"] == "OneCycle"
    assert start.hparams["flip"].WhichOneof("kind") == "bool_value" and hp["flip"] is False  # not 0.0
    # TensorBoard shows the first five columns after sorting on `differs`: the ones that tell runs apart
    shown = sorted(i.name for i in experiment.hparam_infos if i.differs)
    assert shown == sorted(["model", "data", "optimizer", "lr", "max_epochs"])
    assert [m.name.tag for m in experiment.metric_infos][:2] == ["val/acc_best", "test/acc"]
    assert "hp_metric" not in scalars(run.dir)  # no placeholder


def test_custom_scalars_put_train_and_val_side_by_side_and_no_epoch_scalar(run):
    from tensorboard.plugins.custom_scalar import layout_pb2

    acc = accumulator(run.dir)
    (content,) = [c for tag, c in acc.PluginTagToContent("custom_scalars").items()]
    layout = layout_pb2.Layout.FromString(acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}
    assert charts["loss"] == ["train/loss", "val/loss"]
    assert charts["accuracy"][:2] == ["train/acc", "val/acc"]
    assert "epoch" not in scalars(run.dir)
    assert run.dir.parent.name == "mlp-fashion_mnist"  # runs are named by model and data


def test_prediction_grid_confusion_matrix_and_graph(run):
    acc = accumulator(run.dir)
    images = acc.Tags()["images"]
    assert "val/predictions" in images and "test/confusion_matrix" in images
    steps = [e.step for e in acc.Images("val/predictions")]
    assert len(steps) == 2  # epoch 0 and the last epoch (every 5 epochs otherwise)
    grid = acc.Images("val/predictions")[0]
    assert 200 < grid.width <= 1000 and grid.height > 100  # bounded in size
    assert acc.Tags()["graph"]  # the model graph


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_real_tensorboard_server_serves_the_scalars(run):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(run.dir.parent),
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        query = urllib.parse.urlencode({"run": run.dir.name, "tag": "test/acc"})
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?{query}"
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    points = json.loads(response.read())
                if points:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "tensorboard did not serve test/acc within 60 s"
            time.sleep(0.5)
        (wall_time, step, value), = points
        assert value == pytest.approx(results(run.dir)["test/acc"])
    finally:
        server.terminate()
        server.wait(timeout=30)
