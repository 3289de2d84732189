"""TensorBoard's dashboards of a run, read back from its event files with TensorBoard's own
reader: the learning rate of every step, test images and confusions, the Custom Scalars layout;
and what other loggers get."""

import io
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import results, run_train, runs, scalars, write_mnist
from PIL import Image

from lit_models.dashboards import prediction_grid


def events(run):
    """The run's TensorBoard events, every kind kept whole."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(
        str(run), size_guidance={"images": 0, "tensors": 0, "scalars": 0}
    )
    accumulator.Reload()
    return accumulator


def images(run) -> dict[str, tuple[int, Image.Image]]:
    """Every image tag of a run: its step and the image."""
    accumulator = events(run)
    return {
        tag: (event.step, Image.open(io.BytesIO(event.encoded_image_string)))
        for tag in accumulator.Tags()["images"]
        for event in accumulator.Images(tag)
    }


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The MLP recipe for 2 epochs on MNIST IDX files, logging every step, then its test again
    (`train.py test`) in smaller batches."""
    cwd = tmp_path_factory.mktemp("dashboards")
    data = write_mnist(cwd / "data")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        fit = ["--model", "mlp", "--data.data_dir", str(data), "--data.batch_size", "64",
               "--trainer.max_epochs", "2", "--trainer.log_every_n_steps", "1"]
        assert run_train(fit) == 0
        assert run_train(["test", "--ckpt_path", "best", "--data.eval_batch_size", "50"]) == 0
    (fit,) = runs(cwd)  # the test logs inside the run it tests
    return SimpleNamespace(fit=fit, test=fit / "test" / "lightning_logs" / "version_0")


def test_the_learning_rate_of_every_optimizer_step(fitted):
    steps = results(fitted.fit)["global_step"]
    lr = scalars(fitted.fit)["lr-AdamW"]
    assert steps == 2 * (540 // 64) and len(lr) == steps
    # OneCycle with a fifth of the run warming up: up, then down to near zero
    peak = int(np.argmax(lr))
    assert 0 < peak < steps - 1 and lr[peak] == pytest.approx(0.015, rel=0.05)
    assert lr[-1] < lr[0] < lr[peak]


def test_test_images_and_confusion_matrix(fitted):
    shown = images(fitted.fit)
    assert set(shown) == {"test/predictions", "test/confusion_matrix"}
    step, grid = shown["test/predictions"]
    assert step == results(fitted.fit)["global_step"]
    # 32 of the 200 test images, 8 a row; 28 pixels enlarged 3 times, 4 apart
    assert grid.size == (8 * 88 + 4, 4 * 88 + 4)
    step, confusion = shown["test/confusion_matrix"]
    assert confusion.height == 10 * 40 and confusion.width > confusion.height  # names at the left
    # Counted before the model's own hook resets its confusion matrix: the diagonal of a model
    # this accurate is dark.
    pixels = np.asarray(confusion).astype(int)
    dark_blue = (pixels[..., 2] > 150) & (pixels[..., 0] < 100)
    assert results(fitted.fit)["metrics"]["test/acc"] > 0.9 and dark_blue.sum() > 10 * 30 * 30
    # The test run of the same checkpoint, in 4 batches of 50: 8 images of each batch, the same
    # confusions.
    again = images(fitted.test)
    assert again["test/predictions"][1].size == grid.size
    assert again["test/predictions"][1].tobytes() != grid.tobytes()
    assert again["test/confusion_matrix"][1].tobytes() == confusion.tobytes()


def test_custom_scalars_layout(fitted):
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata
    from tensorboard.util import tensor_util

    written = events(fitted.fit).Tensors(metadata.CONFIG_SUMMARY_TAG)
    assert len(written) == 1  # once a run, not again at its test
    layout = layout_pb2.Layout.FromString(tensor_util.make_ndarray(written[0].tensor_proto).item())
    charts = {
        chart.title: list(chart.multiline.tag)
        for category in layout.category
        for chart in category.chart
    }
    assert charts == {
        "loss": ["^train/loss_step$", "^train/loss_epoch$", "^val/loss$"],
        "accuracy": ["^train/acc_step$", "^train/acc_epoch$", "^val/acc$"],
    }
    tags = scalars(fitted.fit)
    epochs = ("train/loss_epoch", "val/loss", "train/acc_epoch", "val/acc")
    assert all(len(tags[tag]) == 2 for tag in epochs)
    assert all(any(re.search(pattern, tag) for tag in tags)
               for chart in charts.values() for pattern in chart)


def test_prediction_grid_marks_mistakes():
    images = torch.full((10, 3, 32, 32), 128, dtype=torch.uint8)
    labels, predicted = torch.arange(10), torch.arange(10)
    predicted[3] = 4
    names = [f"class {k}" for k in range(10)]
    grid = prediction_grid(images, labels, predicted, names).permute(1, 2, 0).numpy()
    # 32 pixels enlarged 3 times, 4 apart; two rows of 8
    assert grid.shape == (2 * 100 + 4, 8 * 100 + 4, 3)

    def red(i):
        """Pixels of the frame and caption colour of a mistake, in image i's cell."""
        row, col = divmod(i, 8)
        cell = grid[row * 100 + 4 : (row + 1) * 100, col * 100 + 4 : (col + 1) * 100].astype(int)
        return int(((cell[..., 0] > 150) & (cell[..., 1] < 60) & (cell[..., 2] < 60)).sum())

    assert red(3) > 4 * 96 and all(red(i) == 0 for i in range(10) if i != 3)


@pytest.mark.parametrize("logger", ["CSVLogger", "MLFlowLogger", "false"])
def test_other_loggers(logger, mnist_dir, in_tmp, monkeypatch):
    """CSV: no images, no error; MLflow: the images as artifacts; no logger: nothing, no error."""
    # mlflow 3 refuses new file stores without it
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    options = {
        "CSVLogger": ["--trainer.logger.save_dir", "logs"],
        "MLFlowLogger": ["--trainer.logger.tracking_uri", f"file:{in_tmp / 'mlruns'}"],
        "false": [],
    }[logger]
    assert run_train(["--model", "mlp", "--data.data_dir", str(mnist_dir), "--data.batch_size",
                      "64", "--trainer.max_epochs", "1", "--trainer.log_every_n_steps", "1",
                      "--trainer.logger", logger, *options]) == 0
    pictures = sorted(in_tmp.glob("mlruns/**/artifacts/test/*.png"))
    assert [p.name for p in pictures] == (
        ["confusion_matrix.png", "predictions.png"] if logger == "MLFlowLogger" else []
    )
    if pictures:
        assert Image.open(pictures[1]).size == (8 * 88 + 4, 4 * 88 + 4)
    if logger == "CSVLogger":
        header = next(in_tmp.glob("logs/**/metrics.csv")).read_text().splitlines()[0]
        assert "lr-AdamW" in header and "test/acc" in header
    assert not list(in_tmp.glob("**/events.out.tfevents.*"))


def test_learning_rate_monitor_steps_aside(mnist_dir, in_tmp):
    """The default monitor logs every step; `callbacks+=` adds a user's beside it, `callbacks=`
    replaces the defaults (LightningCLI's list options); without a logger (Lightning refuses a
    monitor there), none."""
    from lightning.pytorch.callbacks import LearningRateMonitor

    import train

    def monitors(*args):
        """The logging intervals of the LearningRateMonitors a fit of `args` would run."""
        cli = train.TrainCLI(["--model", "mlp", "--data.data_dir", str(mnist_dir), *args],
                             run=False)
        callbacks = cli.trainer.callbacks
        return [c.logging_interval for c in callbacks if isinstance(c, LearningRateMonitor)]

    assert monitors() == ["step"]
    epoch = "--trainer.callbacks.logging_interval=epoch"
    assert monitors("--trainer.callbacks+=LearningRateMonitor", epoch) == ["step", "epoch"]
    assert monitors("--trainer.callbacks=LearningRateMonitor", epoch) == ["epoch"]
    assert monitors("--trainer.logger", "false") == []
