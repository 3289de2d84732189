"""What TensorBoard shows beyond the scalars: the HParams tab, a Custom Scalars layout, prediction grids, the
confusion matrix; and the TensorBoard logger they are written with."""

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from matplotlib.figure import Figure
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

# The metrics runs are compared by in the HParams tab, first shown first; they are logged as scalars.
HPARAM_METRICS = ("val/acc_best", "test/acc", "val/acc", "test/loss", "train/loss")
# The hyperparameters the HParams tab shows as columns before it is told otherwise (it shows five): the ones
# that tell runs apart most often. The others are a tick away.
SHOWN_HPARAMS = ("model", "data", "optimizer", "lr", "max_epochs")
# The Scalars tab's Custom Scalars page: train and val on one chart each, the first thing to look at.
LAYOUT = {
    "train and val": {
        "loss": ["Multiline", ["train/loss", "val/loss"]],
        "accuracy": ["Multiline", ["train/acc", "val/acc", "val/acc_best"]],
    },
    "schedule and speed": {
        "learning rate": ["Multiline", [r"lr-.*"]],
        "images per second": ["Multiline", ["train/images_per_second"]],
    },
}


class TensorBoardLogger(LightningTensorBoardLogger):
    """Lightning's TensorBoardLogger without the `epoch` scalar it adds to every log call (the x-axis of every
    chart is the optimizer step; the epoch is in each chart's hover, as the step of an epoch's last batch)."""

    def log_metrics(self, metrics, step=None):
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)


def tensorboard_logger(trainer) -> LightningTensorBoardLogger | None:
    return next((lg for lg in trainer.loggers if isinstance(lg, LightningTensorBoardLogger)), None)


def hparams_summaries(hparams: dict, metrics: tuple[str, ...], shown: tuple[str, ...]) -> list[Summary]:
    """The HParams plugin's records of one run: the experiment (columns) and the session (this run's values).

    Written by hand rather than with torch's `hparams()`, which records booleans as 1.0/0.0 (it tests for int
    before bool). TensorBoard orders columns by their `differs` flag, then by name, and shows the first five:
    `shown` get the flag, so that the columns that tell runs apart are the ones on screen.
    """
    start = plugin_data_pb2.SessionStartInfo()
    infos = []
    for name, value in hparams.items():
        if isinstance(value, bool):
            start.hparams[name].bool_value, kind = value, "DATA_TYPE_BOOL"
        elif isinstance(value, (int, float)):
            start.hparams[name].number_value, kind = value, "DATA_TYPE_FLOAT64"
        else:
            start.hparams[name].string_value, kind = str(value), "DATA_TYPE_STRING"
        infos.append(api_pb2.HParamInfo(name=name, type=api_pb2.DataType.Value(kind), differs=name in shown))
    experiment = api_pb2.Experiment(hparam_infos=infos,
                                    metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m)) for m in metrics])
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value("STATUS_SUCCESS"))

    def summary(tag, **content):
        data = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **content)
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME,
                                                                      content=data.SerializeToString()))
        return Summary(value=[Summary.Value(tag=tag, metadata=meta)])

    return [summary(metadata.EXPERIMENT_TAG, experiment=experiment),
            summary(metadata.SESSION_START_INFO_TAG, session_start_info=start),
            summary(metadata.SESSION_END_INFO_TAG, session_end_info=end)]


def run_hparams(trainer, module, datamodule) -> dict:
    """The hyperparameters that tell runs apart, as TensorBoard's HParams tab can show them."""
    optimizer = trainer.optimizers[0]
    schedules = trainer.lr_scheduler_configs
    hparams = {
        "model": module.hparams.arch,
        "data": datamodule.name,
        "optimizer": type(optimizer).__name__,
        "lr": float(optimizer.defaults["lr"]),
        "weight_decay": float(optimizer.defaults.get("weight_decay", 0.0)),
        "schedule": type(schedules[0].scheduler).__name__ if schedules else "constant",
        "label_smoothing": float(module.hparams.label_smoothing),
        "batch_size": datamodule.batch_size,
        "effective_batch_size": datamodule.effective_batch_size(trainer),
        "crop_padding": datamodule.crop_padding,
        "flip": datamodule.flip,
        "max_epochs": trainer.max_epochs,
        "precision": str(trainer.precision),
        "seed": datamodule.seed,
    }
    # What a callback of the run adds to tell it apart (a sweep's trial: the options it varies, by their names).
    for callback in trainer.callbacks:
        hparams.update(getattr(callback, "run_hparams", {}))
    return hparams


def prediction_grid(images: torch.Tensor, labels, preds, class_names, columns: int = 8) -> Figure:
    """Images in a grid, each under a 'true / predicted' caption, green where right and red where wrong.

    One axes for the whole grid: a subplot per image takes ~25 ms each to draw.
    """
    lo = images.amin((1, 2, 3), keepdim=True)
    hi = images.amax((1, 2, 3), keepdim=True)
    images = (images - lo) / (hi - lo).clamp(min=1e-6)  # each image stretched to 0..1, for display only
    n, c, h, w = images.shape
    rows, caption = -(-n // columns), h // 2  # a strip above each row of images for the captions
    canvas = torch.ones(3, rows * (h + caption), columns * (w + 2))
    for i, image in enumerate(images):
        r, col = divmod(i, columns)
        top, left = r * (h + caption) + caption, col * (w + 2) + 1
        canvas[:, top:top + h, left:left + w] = image.expand(3, h, w)
    fig = Figure(figsize=(columns * 1.3, rows * 1.5), dpi=80)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(canvas.permute(1, 2, 0).numpy(), interpolation="nearest")
    for i, (label, pred) in enumerate(zip(labels.tolist(), preds.tolist())):
        r, col = divmod(i, columns)
        ax.text(col * (w + 2) + 1 + w / 2, r * (h + caption) + caption - 1,
                f"{class_names[label][:12]}\n{class_names[pred][:12]}", ha="center", va="bottom", fontsize=6,
                color="green" if label == pred else "red")
    ax.axis("off")
    return fig


def confusion_figure(confusion: torch.Tensor, class_names) -> Figure:
    """Counts of (true class, predicted class) on the test set, annotated."""
    n = len(class_names)
    fig = Figure(figsize=(1.0 + 0.6 * n, 0.8 + 0.6 * n), dpi=80)
    ax = fig.add_subplot()
    ax.imshow(confusion.numpy(), cmap="Blues")
    ax.set_xticks(range(n), class_names, rotation=90, fontsize=8)
    ax.set_yticks(range(n), class_names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    threshold = confusion.max().item() / 2
    for (i, j), count in zip(torch.cartesian_prod(torch.arange(n), torch.arange(n)).tolist(),
                             confusion.flatten().tolist()):
        ax.text(j, i, count, ha="center", va="center", fontsize=6,
                color="white" if count > threshold else "black")
    fig.tight_layout()
    return fig


class TensorBoardDashboards(L.Callback):
    """The HParams tab, a grid of validation predictions, and the test confusion matrix.

    - HParams: `run_hparams` with the metrics in HPARAM_METRICS (their real logged values, not
      Lightning's placeholder `hp_metric`), so that runs compare side by side.
    - Custom Scalars: LAYOUT, train and validation loss and accuracy on one chart each.
    - `val/predictions` (Images): the first `max_images` validation images with true and predicted
      labels, every `every_n_epochs` epochs and after the last.
    - `test/confusion_matrix` (Images): after testing.
    All of it is drawn on rank 0 outside the training step, and only with a TensorBoardLogger.
    """

    def __init__(self, every_n_epochs: int = 5, max_images: int = 32):
        self.every_n_epochs, self.max_images = every_n_epochs, max_images

    def on_fit_start(self, trainer, pl_module):
        logger = tensorboard_logger(trainer)
        if logger is None or not trainer.is_global_zero:
            return
        summaries = hparams_summaries(run_hparams(trainer, pl_module, trainer.datamodule), HPARAM_METRICS,
                                      SHOWN_HPARAMS)
        writer = logger.experiment._get_file_writer()  # as Lightning's own log_hyperparams writes them
        for summary in summaries:
            writer.add_summary(summary)
        logger.experiment.add_custom_scalars(LAYOUT)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        epoch = trainer.current_epoch
        due = epoch % self.every_n_epochs == 0 or epoch == trainer.max_epochs - 1
        logger = tensorboard_logger(trainer)
        if batch_idx != 0 or not due or trainer.sanity_checking or not trainer.is_global_zero or logger is None:
            return
        images, labels = batch[0][:self.max_images], batch[1][:self.max_images]
        preds = pl_module(images).argmax(1)
        figure = prediction_grid(images.float().cpu(), labels.cpu(), preds.cpu(), pl_module.class_names)
        logger.experiment.add_figure("val/predictions", figure, trainer.global_step)

    def on_test_end(self, trainer, pl_module):
        logger = tensorboard_logger(trainer)
        if logger is None or not trainer.is_global_zero:
            return
        figure = confusion_figure(pl_module.test_confusion_matrix, pl_module.class_names)
        logger.experiment.add_figure("test/confusion_matrix", figure, trainer.global_step)
