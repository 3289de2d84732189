"""One LightningModule for image classification: normalisation, loss, metrics and optimisation around a network."""

import functools
import inspect
import math
from collections import OrderedDict
from typing import Callable, Literal, Optional, Union

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import BaseFinetuning, BatchSizeFinder, StochasticWeightAveraging
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassConfusionMatrix

from datamodules.base import mix_seed
from lit_models.networks import NETWORKS, TutorialCNN, import_class, network_class


class ModelError(RuntimeError):
    """The model cannot be built, trained or used as asked; the message says why and what to do."""


# A network class, or a partial of one, that takes (image_shape, num_classes) and builds the network: what
# LightningCLI makes of `--model.net CLASS --model.net.ARG VALUE`, as it makes optimizers of `--model.optimizer`.
NetworkCallable = Callable[[tuple[int, int, int], int], torch.nn.Module]


def as_spec(part):
    """A part of the model (network, optimizer, schedule) as a checkpoint keeps it: `{class_path, init_args}`,
    plain data that loads with torch's weights_only=True. A name, a class or a `functools.partial` of a class;
    anything else (LightningCLI's own partials, whose configuration LightningCLI records itself) as it is."""
    if isinstance(part, str):
        try:
            part = network_class(part)
        except ValueError as e:
            raise ModelError(str(e)) from None
    if isinstance(part, type):
        part = functools.partial(part)
    if isinstance(part, functools.partial) and isinstance(part.func, type) and not part.args:
        return {"class_path": f"{part.func.__module__}.{part.func.__qualname__}", "init_args": dict(part.keywords)}
    return part


def as_factory(part):
    """The callable a spec of `as_spec` stands for (a partial of its class); a callable as it is."""
    if isinstance(part, dict) and "class_path" in part:
        try:
            cls = import_class(part["class_path"])
        except (ImportError, AttributeError, ValueError):
            raise ModelError(f"{part['class_path']} cannot be imported") from None
        return functools.partial(cls, **(part.get("init_args") or {}))
    return as_factory(as_spec(part)) if isinstance(part, str) else part


def stopped_mid_epoch(checkpoint: dict) -> bool:
    """Whether a training checkpoint was saved after some of an epoch's batches, before the epoch's end."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs = fit.get("epoch_progress", {}).get("total", {})
    batches = fit.get("epoch_loop.batch_progress", {}).get("current", {})
    return epochs.get("processed", 0) < epochs.get("started", 0) and batches.get("completed", 0) > 0


class ImageClassifier(L.LightningModule):
    """Cross-entropy classifier around a network (`--model RECIPE` of configs/; `ImageClassifier("mlp")` in Python).

    The model owns its input: it takes uint8 images (N, C, H, W), 0..255, and normalises them with its own mean
    and standard deviation, which it keeps (with the image shape and class names) in every checkpoint, so that
    test, predict, `classify` and exported models see what training saw. Float batches are refused (a
    ToTensor/Normalize pipeline would be normalised twice). What is not given is taken from the data module:
    by train.py when it builds the model, by `take_from_data`, or when fitting starts (`configure_model`).

    Args:
        net: the network, the LightningCLI way: a class (or a partial of one) taking (image_shape, num_classes)
            and arguments of its own (`--model.net lit_models.TutorialMLP --model.net.hidden 256`); a name in
            lit_models.networks.NETWORKS or an import path; or `{class_path, init_args}`; None: the tutorial CNN.
            (None rather than a class as the default: jsonargparse would carry the default class's settings over
            to the class a recipe names.)
        image_shape: (channels, height, width) of the images; None: the data module's.
        num_classes: number of classes; None: the data module's.
        class_names: names of the classes; None: the data module's.
        mean: per-channel mean of the input normalisation on the 0..1 scale; None: the data module's
            (its training images'); the tutorials use 0.5.
        std: per-channel standard deviation of the normalisation, likewise.
        lr: the learning rate (the peak of a OneCycle schedule), which Lightning's learning-rate finder sets;
            None: the optimizer's own. train.py refuses `--model.optimizer.lr` beside it.
        optimizer: any torch optimizer and its arguments (`--model.optimizer SGD --model.optimizer.momentum 0.9`).
        scheduler: the learning-rate schedule; one that takes `total_steps` (`--model.scheduler OneCycle`) is
            planned over the run's optimizer steps and stepped every step, others every epoch; null: constant.
        label_smoothing: label smoothing of the training loss, in [0, 1] (evaluation losses use none).
        mixup: alpha of torchvision's MixUp of training batches (0: off); the training accuracy counts each
            prediction by the share of its class in the mixed label.
        cutmix: alpha of torchvision's CutMix (0: off); with mixup too, each batch takes one of the two.
        flip_test: when evaluating (validation, test, predict, `classify`, exports), average the logits of each
            image and of its mirror image: test-time augmentation for data whose classes survive a flip.
        channels_last: the NHWC memory layout for convolutional networks (faster on GPUs and CPUs alike).
        compile: `torch.compile` the network: true, or a mode ("reduce-overhead": CUDA graphs, "max-autotune").
    """

    def __init__(self, net: Optional[NetworkCallable] = None, image_shape: Optional[tuple[int, int, int]] = None,
                 num_classes: Optional[int] = None, class_names: Optional[list[str]] = None,
                 mean: Optional[list[float]] = None, std: Optional[list[float]] = None, lr: Optional[float] = None,
                 optimizer: OptimizerCallable = torch.optim.AdamW, scheduler: Optional[LRSchedulerCallable] = None,
                 label_smoothing: float = 0.0, mixup: float = 0.0, cutmix: float = 0.0, flip_test: bool = False,
                 channels_last: bool = True, compile: Union[bool, Literal["reduce-overhead", "max-autotune"]] = False):
        super().__init__()
        if lr is not None and not (math.isfinite(lr) and lr > 0):
            raise ModelError(f"--model.lr {lr}: a learning rate is a positive number")
        if not 0 <= label_smoothing <= 1 or min(mixup, cutmix) < 0:
            raise ModelError(f"--model.label_smoothing {label_smoothing} must be in [0, 1], --model.mixup {mixup} "
                             f"and --model.cutmix {cutmix} at least 0")
        net = TutorialCNN if net is None else net
        self.net_factory, self.optimizer_factory, self.scheduler_factory = map(as_factory, (net, optimizer, scheduler))
        # Hyperparameters are data (as_spec): a checkpoint rebuilds the same network, optimizer and schedule.
        net, optimizer, scheduler = map(as_spec, (net, optimizer, scheduler))
        self.save_hyperparameters()
        self.net = None
        self.built_from_data = False  # built in configure_model, after callbacks have seen the model
        self.val_loss, self.val_acc = MeanMetric(nan_strategy="disable"), MeanMetric(nan_strategy="disable")
        self.test_loss, self.test_acc = MeanMetric(nan_strategy="disable"), MeanMetric(nan_strategy="disable")
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # in checkpoints: a resumed run remembers its best epoch
        # Sums of the training loss and accuracy over the images since they were last logged (logs_at), and their
        # means over the epoch: metrics of values summed over the processes already (no sync when a progress bar on
        # one process reads them, which would hang DDP: Lightning-AI/pytorch-lightning#21264).
        self.train_window, self.window_images = torch.zeros(2), 0  # float32 whatever --trainer.precision says
        self.train_loss = MeanMetric(nan_strategy="disable", sync_on_compute=False)
        self.train_acc = MeanMetric(nan_strategy="disable", sync_on_compute=False)
        if image_shape is not None and num_classes is not None:
            self._build()

    @property
    def net_name(self) -> str:
        """The network's short name (NETWORKS), or its class name."""
        if self.net is None:
            return str((self.hparams.net or {}).get("class_path", "")).rpartition(".")[2] or "network"
        return {cls: name for name, cls in NETWORKS.items()}.get(type(self.net), type(self.net).__name__)

    def _build(self) -> None:
        hp = self.hparams
        try:
            net = self.net_factory(tuple(hp.image_shape), hp.num_classes)
        except (ValueError, TypeError) as e:  # what a network says about the shape or arguments it was given
            raise ModelError(f"the network {self.net_name} cannot be built for {tuple(hp.image_shape)} images of "
                             f"{hp.num_classes} classes: {e}") from None
        if not isinstance(net, torch.nn.Module):
            raise ModelError(f"--model.net built a {type(net).__name__}, not an nn.Module")
        self.uses_channels_last = hp.channels_last and any(isinstance(m, torch.nn.Conv2d) for m in net.modules())
        if self.uses_channels_last:
            net = net.to(memory_format=torch.channels_last)
        if hp.compile:
            net.compile(mode=None if hp.compile is True else hp.compile)  # in place: state_dict keys stay the same
        else:  # for the model summary and TensorBoard's graph (a compiled network cannot be traced)
            self.example_input_array = torch.zeros(1, *hp.image_shape, dtype=torch.uint8)
        self.net = net
        # Buffers, so that the normalisation travels with the weights (and a loaded checkpoint's wins); until the
        # data module gives its statistics (take_from_data), none.
        self.register_buffer("mean", torch.zeros(1, hp.image_shape[0], 1, 1))
        self.register_buffer("std", torch.ones(1, hp.image_shape[0], 1, 1))
        if hp.mean is not None and hp.std is not None:
            self._set_normalisation()
        self.test_confusion = MulticlassConfusionMatrix(hp.num_classes, validate_args=False)

    def _set_normalisation(self) -> None:
        hp = self.hparams
        if len(hp.mean) != hp.image_shape[0] or len(hp.std) != hp.image_shape[0] or min(hp.std) <= 0:
            raise ModelError(f"mean {hp.mean} and std {hp.std} need one value per channel of {tuple(hp.image_shape)} "
                             f"images, and std > 0")
        self.mean.copy_(torch.tensor(hp.mean).view(1, -1, 1, 1))
        self.std.copy_(torch.tensor(hp.std).view(1, -1, 1, 1))

    def take_from_data(self, data, statistics: bool = True) -> None:
        """Take what was not given (image shape, classes, class names; with `statistics`, the training images' mean
        and std, which reads them) from the data module `data`, and build the network if it is not built yet. The
        hyperparameters, and so hparams.yaml and TensorBoard's HParams, then hold the values the model uses."""
        hp = self.hparams
        facts = {"image_shape": lambda: list(data.image_shape), "num_classes": lambda: len(data.classes),
                 "class_names": lambda: list(data.classes)}
        if statistics:
            facts.update(mean=lambda: list(data.mean), std=lambda: list(data.std))
        missing = []
        for name, fact in facts.items():
            if hp[name] is None:
                try:
                    hp[name] = fact()
                except AttributeError:  # a data module of its own, without these attributes
                    missing.append(name)
        missing = [name for name in missing if name != "class_names"]  # numbers serve as names
        if missing:
            raise ModelError(f"the data module {type(data).__name__} does not say the images' "
                             f"{', '.join(missing)}: give them to the model "
                             f"({' '.join(f'--model.{name} ...' for name in missing)})")
        if self.net is None:
            self._build()  # with the normalisation, where it is known
        elif hp.mean is not None and hp.std is not None:
            self._set_normalisation()
        self.save_hyperparameters(dict(hp))  # what Lightning logs is the model's initial hyperparameters

    @property
    def backbone(self) -> torch.nn.Module:
        """The network but its last layer: what Lightning's BackboneFinetuning freezes and thaws
        (`--trainer.callbacks+=BackboneFinetuning`)."""
        if not isinstance(self.net, torch.nn.Sequential):
            raise ModelError(f"BackboneFinetuning takes the layers but the last of an nn.Sequential network as its "
                             f"backbone; {self.net_name} is not one: give your model a `backbone`")
        return torch.nn.Sequential(OrderedDict(list(self.net.named_children())[:-1]))  # the same layers

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
        # Callbacks that change what a schedule over the whole run was planned for, after it was planned.
        changes = {BaseFinetuning: "adds the layers it thaws to the optimizer", BatchSizeFinder: "changes the batches"}
        for callback in self.trainer.callbacks if stage == "fit" and self.per_step_schedule else ():
            for cls, change in changes.items():
                if isinstance(callback, cls):
                    raise ModelError(f"{type(callback).__name__} {change} after the schedule (--model.scheduler) "
                                     f"planned the run's steps: give --model.scheduler null, or an epoch schedule")

    def configure_model(self) -> None:
        """Take what the model lacks from the data module: the network if it is not built yet, and the statistics
        (Lightning calls this hook after prepare_data and setup, before it logs the hyperparameters and configures
        the optimizers; callbacks such as WeightAveraging call it earlier)."""
        if self.net is not None and self.hparams.mean is not None:
            return
        if self.trainer.datamodule is None:
            raise ModelError("ImageClassifier needs image_shape, num_classes, mean and std, or a data module")
        self.built_from_data = self.net is None
        self.take_from_data(self.trainer.datamodule)

    def on_fit_start(self):
        # StochasticWeightAveraging copies the model in its setup, before configure_model (WeightAveraging, its
        # successor, calls configure_model first): its copy would have no network to average.
        if self.built_from_data and any(isinstance(c, StochasticWeightAveraging) for c in self.trainer.callbacks):
            raise ModelError("StochasticWeightAveraging copies the model before it is built from the data: give the "
                             "model its image_shape and num_classes, or call model.take_from_data(data) before "
                             "fitting (train.py does), or average with EMA or WeightAveraging, which build it first")

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

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) for uint8 images (N, C, H, W) (or floats on the same 0..255 scale)."""
        if self.net is None or self.hparams.mean is None:
            raise ModelError("the model has no network or normalisation yet: give it image_shape, num_classes, "
                             "mean and std, or fit it with a data module first (or model.take_from_data(data))")
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

    def logs_at(self, batch_idx: int) -> bool:
        """Whether a training step logs train/loss and train/acc (the means since the last time): where Lightning's
        loggers write a step, before a validation, at an epoch's end (a `self.log` a step costs: docs/design.md)."""
        trainer, every = self.trainer, self.trainer.log_every_n_steps
        return bool(every and (trainer.global_step + 1) % every == 0) or batch_idx + 1 == trainer.num_training_batches \
            or (batch_idx + 1) % (trainer.val_check_batch or float("inf")) == 0

    def check_batch(self, images: torch.Tensor) -> None:
        """A ModelError for a batch that is not uint8 images: floats may be normalised already, and would be
        normalised again (a dtype, not a value: no wait for the device)."""
        if images.is_floating_point():
            dtype = str(images.dtype).removeprefix("torch.")
            raise ModelError(f"ImageClassifier takes uint8 image batches (0..255) and normalises them itself; this "
                             f"batch is {dtype} (ToTensor/Normalize?): give it uint8 images (torchvision's "
                             f"transforms.v2.PILToTensor()), or a data module of datamodules/")

    def training_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss the optimizer minimises: cross-entropy with label smoothing. `targets` are class indices (N,),
        or class probabilities (N, classes) under mixup or cutmix. A subclass overrides it for another loss."""
        return F.cross_entropy(logits, targets, label_smoothing=self.hparams.label_smoothing)

    def mix(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """torchvision's MixUp or CutMix of a batch (as floats on the 0..255 scale) and its labels as class
        probabilities; the mixing weights a function of the seed and the step, so that a resumed run mixes as an
        uninterrupted one does."""
        from torchvision.transforms import v2

        hp = self.hparams
        mixes = [transform(alpha=alpha, num_classes=hp.num_classes)
                 for alpha, transform in ((hp.mixup, v2.MixUp), (hp.cutmix, v2.CutMix)) if alpha > 0]
        with torch.random.fork_rng(devices=[]):  # torchvision draws from the CPU's generator: no device sync
            torch.manual_seed(mix_seed(torch.initial_seed(), self.global_step, self.global_rank))
            return v2.RandomChoice(mixes)(images.float(), labels)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.check_batch(images)
        targets = labels
        if self.hparams.mixup or self.hparams.cutmix:
            images, targets = self.mix(images, labels)
        logits = self(images)
        loss = self.training_loss(logits, targets)
        predicted = logits.argmax(1)
        # Mixed labels: a prediction counts by its class's share of the label.
        correct = (predicted == targets) if targets.dim() == 1 else targets.gather(1, predicted[:, None])
        self.train_window = self.train_window.to(loss.device)  # a no-op but on the first step
        self.train_window += torch.stack([loss.detach(), correct.float().mean()]).float() * len(labels)
        self.window_images += len(labels)
        if self.logs_at(batch_idx):
            # Every process logs at the same steps: their sums, added up here, are the images of all of them.
            loss_sum, acc_sum, images = self.trainer.strategy.reduce(
                torch.cat([self.train_window, self.train_window.new_tensor([self.window_images])]), reduce_op="sum")
            self.train_loss(loss_sum / images, weight=images)
            self.train_acc(acc_sum / images, weight=images)
            self.log_dict({"train/loss": self.train_loss, "train/acc": self.train_acc}, on_step=True, on_epoch=True,
                          prog_bar=True)
            self.train_window.zero_()
            self.window_images = 0
        return loss

    def on_train_epoch_end(self):
        self.raise_if_not_finite()

    def on_save_checkpoint(self, checkpoint):
        self.raise_if_not_finite()  # no checkpoint ever holds the weights of a diverged run
        checkpoint["train_window"] = [*self.train_window.tolist(), self.window_images]  # a resumed epoch's means

    def on_load_checkpoint(self, checkpoint):
        self.check_weights(checkpoint.get("state_dict", {}))  # before Lightning loads them, strictly
        *window, self.window_images = checkpoint.get("train_window", [0.0, 0.0, 0])
        self.train_window = torch.tensor(window)
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
        damaged = [k for k, v in weights.items() if (k.startswith("net.") or k in ("mean", "std")) and
                   v.is_floating_point() and not torch.isfinite(v).all()]  # (no validation: val_acc_best is -inf)
        if damaged:
            raise ModelError(f"the checkpoint holds NaN or infinite weights ({', '.join(damaged[:4])}): it is "
                             f"damaged, or saved from a diverged run; use another")
        if wrong:
            raise ModelError(f"the checkpoint's weights do not fit this model ({self.net_name} for "
                             f"{self.hparams.num_classes} classes of {tuple(self.hparams.image_shape)} images): "
                             f"{', '.join(wrong[:4])} missing, unexpected or of another shape")

    def raise_if_not_finite(self) -> None:
        """A ModelError if a weight of the network is NaN or infinite: a diverged run stops before a checkpoint, an
        export or a test holds it."""
        # Not a collective: every process holds the same weights, and stops alike.
        if self.net is not None and not torch.stack([p.isfinite().all() for p in self.net.parameters()]).all():
            raise ModelError(f"the weights became NaN or infinite in epoch {self.current_epoch} (by step "
                             f"{self.global_step}); no checkpoint holds them. Try a lower learning rate (--model.lr)")

    def _evaluate(self, batch, stage: str) -> torch.Tensor:
        images, labels = batch
        self.check_batch(images)
        logits = self(images)
        loss, acc = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        loss.update(F.cross_entropy(logits, labels, reduction="none"))  # per image: exact means, last batch too
        acc.update((logits.argmax(1) == labels).float())
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

    @property
    def per_step_schedule(self) -> bool:
        """Whether the schedule is planned over the run's steps (it takes `total_steps`: OneCycle)."""
        # A schedule class, or a partial of one (what LightningCLI makes of --model.scheduler, its arguments bound).
        return self.scheduler_factory is not None and (
            "total_steps" in inspect.signature(self.scheduler_factory).parameters or
            "total_steps" in getattr(self.scheduler_factory, "keywords", {}))

    def configure_optimizers(self):
        trained = [p for p in self.parameters() if p.requires_grad]  # frozen ones (a backbone's) join later
        try:
            optimizer = self.optimizer_factory(trained, **({} if self.hparams.lr is None else {"lr": self.hparams.lr}))
        except ValueError as e:  # torch's own check of its arguments (a negative lr, betas out of range)
            raise ModelError(f"--model.optimizer: {e}") from None
        if self.scheduler_factory is None:
            return optimizer
        if not self.per_step_schedule:
            return {"optimizer": optimizer, "lr_scheduler": self.scheduler_factory(optimizer)}
        steps = self.trainer.estimated_stepping_batches
        if steps == float("inf"):
            raise ModelError("a schedule over the whole run needs --trainer.max_epochs or --trainer.max_steps")
        scheduler = self.scheduler_factory(optimizer, total_steps=max(1, int(steps)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
