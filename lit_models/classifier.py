"""One LightningModule for image classification: normalisation, loss, metrics and optimisation around a network."""

import inspect
from typing import Literal, Optional, Union

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassConfusionMatrix

from lit_models.networks import network_class


class ModelError(RuntimeError):
    """The model cannot be built, trained or used as asked; the message says why and what to do."""


def _network(arch: str) -> type[torch.nn.Module]:
    try:
        return network_class(arch)
    except ValueError as e:
        raise ModelError(str(e)) from None


def stopped_mid_epoch(checkpoint: dict) -> bool:
    """Whether a training checkpoint was saved after some of an epoch's batches, before the epoch's end."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs = fit.get("epoch_progress", {}).get("total", {})
    batches = fit.get("epoch_loop.batch_progress", {}).get("current", {})
    return epochs.get("processed", 0) < epochs.get("started", 0) and batches.get("completed", 0) > 0


class ImageClassifier(L.LightningModule):
    """Cross-entropy classifier around a network (`--model RECIPE` of configs/; `ImageClassifier("mlp")` in Python).

    The model owns its input: it takes uint8 images (N, C, H, W) and normalises them with its own mean and
    standard deviation, which it keeps (with the image shape and class names) in every checkpoint, so that
    test, predict, `classify` and exported models see what training saw. What is not given is filled in from
    the data module when training starts (`setup`), from the CLI and from plain Python alike.

    Args:
        arch: the network: a name in lit_models.networks.NETWORKS, or the import path of any nn.Module class
            taking (image_shape, num_classes).
        image_shape: (channels, height, width) of the images; None: the data module's.
        num_classes: number of classes; None: the data module's.
        class_names: names of the classes; None: the data module's.
        mean: per-channel mean of the input normalisation on the 0..1 scale; None: the data module's
            (its training images'); the tutorials use 0.5.
        std: per-channel standard deviation of the normalisation, likewise.
        lr: the learning rate (the peak of a OneCycle schedule); None: the optimizer's own. Lightning's
            learning-rate finder sets it.
        optimizer: any torch optimizer and its arguments (`--model.optimizer SGD --model.optimizer.momentum 0.9`).
        scheduler: the learning-rate schedule; one that takes `total_steps` (`--model.scheduler OneCycle`) is
            planned over the run's optimizer steps and stepped every step, others every epoch; null: constant.
        label_smoothing: label smoothing of the training loss, in [0, 1] (evaluation losses use none).
        flip_test: when evaluating (validation, test, predict, `classify`, exports), average the logits of each
            image and of its mirror image: test-time augmentation for data whose classes survive a flip.
        channels_last: the NHWC memory layout for convolutional networks (faster on GPUs and CPUs alike).
        compile: `torch.compile` the network: true, or a mode ("reduce-overhead": CUDA graphs, "max-autotune").
    """

    def __init__(
        self,
        arch: str = "cnn",
        image_shape: Optional[tuple[int, int, int]] = None,
        num_classes: Optional[int] = None,
        class_names: Optional[list[str]] = None,
        mean: Optional[list[float]] = None,
        std: Optional[list[float]] = None,
        lr: Optional[float] = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: Optional[LRSchedulerCallable] = None,
        label_smoothing: float = 0.0,
        flip_test: bool = False,
        channels_last: bool = True,
        compile: Union[bool, Literal["reduce-overhead", "max-autotune"]] = False,
    ):
        super().__init__()
        # The optimizer and schedule are code, not data: kept out of the checkpoint's hyperparameters so that
        # it loads with torch's weights_only=True (the run's config.yaml records them).
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        _network(arch)  # a wrong name fails here, before any data is read
        self.net = None
        self.built_from_data = False  # built in configure_model, after callbacks have seen the model
        self.val_loss, self.val_acc = MeanMetric(nan_strategy="disable"), MeanMetric(nan_strategy="disable")
        self.test_loss, self.test_acc = MeanMetric(nan_strategy="disable"), MeanMetric(nan_strategy="disable")
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # in checkpoints: a resumed run remembers its best epoch
        self.train_sums, self.train_steps = torch.zeros(2), 0
        if image_shape is not None and num_classes is not None and mean is not None and std is not None:
            self._build()

    def _build(self) -> None:
        hp = self.hparams
        if len(hp.mean) != hp.image_shape[0] or len(hp.std) != hp.image_shape[0] or min(hp.std) <= 0:
            raise ModelError(f"mean {hp.mean} and std {hp.std} need one value per channel of {tuple(hp.image_shape)} "
                             f"images, and std > 0")
        try:
            net = _network(hp.arch)(tuple(hp.image_shape), hp.num_classes)
        except ValueError as e:  # what a network says about the shape it was given
            raise ModelError(str(e)) from None
        self.uses_channels_last = hp.channels_last and any(isinstance(m, torch.nn.Conv2d) for m in net.modules())
        if self.uses_channels_last:
            net = net.to(memory_format=torch.channels_last)
        if hp.compile:
            net.compile(mode=None if hp.compile is True else hp.compile)  # in place: state_dict keys stay the same
        else:  # for the model summary and TensorBoard's graph (a compiled network cannot be traced)
            self.example_input_array = torch.zeros(1, *hp.image_shape, dtype=torch.uint8)
        self.net = net
        # Buffers, so that the normalisation travels with the weights (and a loaded checkpoint's wins).
        self.register_buffer("mean", torch.tensor(hp.mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(hp.std, dtype=torch.float32).view(1, -1, 1, 1))
        self.test_confusion = MulticlassConfusionMatrix(hp.num_classes, validate_args=False)

    @property
    def class_names(self) -> list[str]:
        return list(self.hparams.class_names or map(str, range(self.hparams.num_classes)))

    def setup(self, stage: str) -> None:
        """Refuse data the model was not built for (and take its class names if it has none)."""
        data = self.trainer.datamodule
        if self.net is not None and data is not None:
            if self.hparams.class_names is None and len(getattr(data, "classes", ())) == self.hparams.num_classes:
                self.hparams.class_names = list(data.classes)
            self.check_data(data)

    def configure_model(self) -> None:
        """Build the network, taking what the model does not know yet from the data module (Lightning calls this
        hook before it configures the optimizers, and callbacks such as WeightAveraging call it earlier)."""
        if self.net is not None:
            return
        data = self.trainer.datamodule
        if data is None:
            raise ModelError("ImageClassifier needs image_shape, num_classes, mean and std, or a data module")
        hp = self.hparams
        for name, value in (("image_shape", lambda: tuple(data.image_shape)),
                            ("num_classes", lambda: len(data.classes)), ("class_names", lambda: list(data.classes)),
                            ("mean", lambda: list(data.mean)), ("std", lambda: list(data.std))):
            if hp[name] is None:
                hp[name] = value()
        self._build()
        self.built_from_data = True

    def on_fit_start(self):
        # StochasticWeightAveraging copies the model in its setup, before configure_model (WeightAveraging, its
        # successor, calls configure_model first): its copy would have no network to average.
        if self.built_from_data and any(isinstance(c, StochasticWeightAveraging) for c in self.trainer.callbacks):
            raise ModelError("StochasticWeightAveraging copies the model before it is built from the data: give the "
                             "model its image_shape, num_classes, mean and std (--model.image_shape ...), or average "
                             "with EMA or WeightAveraging, which build it first")

    def check_data(self, data) -> None:
        """A ModelError if `data`'s images or classes are not the ones this model was built for."""
        hp = self.hparams
        shape, classes = getattr(data, "image_shape", None), getattr(data, "classes", None)
        if (shape is not None and tuple(shape) != tuple(hp.image_shape)) or \
                (classes is not None and list(classes) != self.class_names):
            raise ModelError(f"this model takes {tuple(hp.image_shape)} images of {hp.num_classes} classes "
                             f"({', '.join(self.class_names[:3])}, ...); the data module "
                             f"{type(data).__name__} has {tuple(shape or ())} images of {len(classes or [])} classes "
                             f"({', '.join((classes or [])[:3])}, ...)")

    # --- using the model -----------------------------------------------------------------------------

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) for uint8 images (N, C, H, W) (or floats on the same 0..255 scale)."""
        if self.net is None:
            raise ModelError("the model has no network yet: give it image_shape, num_classes, mean and std, "
                             "or fit it with a data module first")
        scale = 1 / (255 * self.std)  # (x / 255 - mean) / std as one multiply-add per element
        x = torch.addcmul(-self.mean / self.std, images.to(scale.dtype), scale)
        if self.uses_channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.hparams.flip_test and not self.training:
            return (self.net(x) + self.net(x.flip(3))) / 2
        return self.net(x)

    @torch.no_grad()
    def classify(self, images) -> torch.Tensor:
        """Class probabilities (N, num_classes) for a uint8 batch (N, C, H, W), a PIL image, or a list of them.

        PIL images are decoded as the image-folder data module decodes files, and resized to the model's input:

            model = ImageClassifier.load_from_checkpoint("lightning_logs/version_0/checkpoints/last.ckpt")
            probabilities = model.classify(PIL.Image.open("cat.png"))
        """
        from datamodules.images import to_uint8_batch

        was_training = self.training
        self.eval()
        try:
            return self(to_uint8_batch(images, tuple(self.hparams.image_shape)).to(self.device)).softmax(1)
        finally:
            self.train(was_training)

    # --- training --------------------------------------------------------------------------------------

    def on_train_epoch_start(self):
        # The epoch's sums of the batches' loss and accuracy, on the device: every training batch is full, so their
        # mean is the mean over the images. Plain tensors: a torchmetrics update or a `self.log` per step costs
        # more Python than a whole step of the tutorial networks on a GPU.
        self.train_sums = torch.zeros(2, device=self.device)
        self.train_steps = 0

    def training_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        # Nothing here waits for the device: the sums are read once per epoch.
        self.train_sums += torch.stack([loss.detach(), (logits.argmax(1) == labels).float().mean()])
        self.train_steps += 1
        return loss

    def on_train_epoch_end(self):
        self.raise_if_not_finite()
        if self.train_steps:
            loss, acc = (self.train_sums / self.train_steps).unbind()
            # The same number of steps on every process: the mean over processes is the mean over the images.
            self.log_dict({"train/loss": loss, "train/acc": acc}, prog_bar=True, sync_dist=True)

    def on_save_checkpoint(self, checkpoint):
        self.raise_if_not_finite()  # no checkpoint ever holds the weights of a diverged run

    def on_load_checkpoint(self, checkpoint):
        self.check_weights(checkpoint.get("state_dict", {}))  # before Lightning loads them, strictly
        try:
            data = self.trainer.datamodule if self.trainer.training else None
        except RuntimeError:  # not attached to a Trainer: load_from_checkpoint
            return
        if data is not None and type(data).state_dict is not L.LightningDataModule.state_dict and \
                not checkpoint.get(type(data).__qualname__) and stopped_mid_epoch(checkpoint):
            # Without the data module's position, the epoch would restart its batches from the first (a checkpoint
            # of an earlier version of this project): some would be trained twice, others never.
            raise ModelError(f"this checkpoint was saved in the middle of epoch {checkpoint.get('epoch')} without "
                             f"the position of {type(data).__name__} in it, so resuming could not train that epoch's "
                             f"batches exactly once: resume from a checkpoint saved at the end of an epoch, or start "
                             f"a new run")

    def check_weights(self, weights: dict) -> None:
        """A ModelError naming the weights that are missing, unexpected or of another shape than this model's."""
        ours = self.state_dict()
        wrong = sorted(ours.keys() ^ weights.keys()) + [k for k in ours.keys() & weights.keys()
                                                       if ours[k].shape != weights[k].shape]
        if wrong:
            raise ModelError(f"the checkpoint's weights do not fit this model ({self.hparams.arch} for "
                             f"{self.hparams.num_classes} classes of {tuple(self.hparams.image_shape)} images): "
                             f"{', '.join(wrong[:4])} missing, unexpected or of another shape")

    def raise_if_not_finite(self) -> None:
        """A ModelError if a training loss of this epoch so far was NaN or infinite (on any process)."""
        if self.trainer.training and self.train_steps and \
                not torch.isfinite(self.trainer.strategy.reduce(self.train_sums[0], reduce_op="sum")):
            raise ModelError(f"the training loss became NaN or infinite in epoch {self.current_epoch} (by step "
                             f"{self.global_step}); no checkpoint holds it. Try a lower learning rate (--model.lr)")

    # --- evaluation ------------------------------------------------------------------------------------

    def _evaluate(self, batch, stage: str) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        correct = (logits.argmax(1) == labels).float()
        loss, acc = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        loss.update(F.cross_entropy(logits, labels, reduction="none"))  # per image: exact means, last batch too
        acc.update(correct)
        self.log_dict({f"{stage}/loss": loss, f"{stage}/acc": acc}, on_epoch=True, prog_bar=stage == "val")
        return logits

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:  # the untrained model is no one's best epoch
            return
        self.val_acc_best.update(self.val_acc.compute())
        best = self.val_acc_best.compute()
        # hp_metric: what TensorBoard's HParams tab compares runs by. The same value on every process (from the
        # synced val/acc): sync_dist only keeps Lightning from warning that it might not be.
        self.log_dict({"val/acc_best": best, "hp_metric": best}, prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.test_confusion.update(self._evaluate(batch, "test"), batch[1])

    def on_test_epoch_end(self):
        confusion = self.test_confusion.compute()  # rows: true class, columns: predicted
        self.test_confusion.reset()
        per_class = confusion.diag() / confusion.sum(1)  # NaN for a class without test images
        self.log_dict({f"test/acc_class/{name}": acc for name, acc in zip(self.class_names, per_class)},
                      sync_dist=True)

    def predict_step(self, batch, batch_idx):
        """Class probabilities for a batch of uint8 images, or of (images, labels)."""
        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(images).softmax(1)

    # --- optimisation ------------------------------------------------------------------------------------

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters(), **({} if self.hparams.lr is None else
                                                                 {"lr": self.hparams.lr}))
        if self.scheduler_factory is None:
            return optimizer
        # A schedule class, or a partial of one (what LightningCLI makes of --model.scheduler, its arguments bound).
        per_step = "total_steps" in inspect.signature(self.scheduler_factory).parameters or \
            "total_steps" in getattr(self.scheduler_factory, "keywords", {})
        if not per_step:
            return {"optimizer": optimizer, "lr_scheduler": self.scheduler_factory(optimizer)}
        steps = self.trainer.estimated_stepping_batches
        if steps == float("inf"):
            raise ModelError("a schedule over the whole run needs --trainer.max_epochs or --trainer.max_steps")
        scheduler = self.scheduler_factory(optimizer, total_steps=max(1, int(steps)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
