"""One LightningModule for image classification: normalisation, loss, metrics and optimisation
around a network."""

import sys
from collections import OrderedDict
from typing import Literal, Optional, Union

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_only
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassConfusionMatrix

from datamodules.augment import mix_seed
from lit_models import checks, parts, predict, resume, schedules, test_time
from lit_models.checks import ModelError
from lit_models.networks import TutorialCNN
from lit_models.tags import class_metrics

__all__ = ["ImageClassifier", "ModelError"]


class ImageClassifier(L.LightningModule):
    """Cross-entropy classifier around a network (`--model RECIPE` of configs/;
    `ImageClassifier("mlp")` in Python).

    It takes batches of images (N, C, H, W) and labels. uint8 images (0..255) it normalises with
    its own mean and standard deviation, kept (with the image shape and class names) in every
    checkpoint, so that test, predict, `classify` and exported models see what training saw. Float
    images it takes as they are: a data module's ToTensor (and Normalize) made them what they are,
    and normalising them again would be twice. What is not given is taken from the data module:
    by train.py when it builds the model, by `take_from_data`, or when fitting starts
    (`configure_model`).

    Args:
        net: the network, the LightningCLI way: a class (or a partial of one) taking (image_shape,
            num_classes), or num_classes alone, and arguments of its own (`--model.net TutorialMLP
            --model.net.hidden 256`); a name in lit_models.networks.NETWORKS or an import path;
            or `{class_path, init_args}`; None: the tutorial CNN.
        image_shape: (channels, height, width) of the images; None: the data module's.
        num_classes: number of classes; None: the data module's.
        class_names: names of the classes; None: the data module's.
        mean: per-channel mean of the normalisation of uint8 images, on the 0..1 scale; None: the
            data module's (its training images'), or 0 where it has none; the tutorials use 0.5.
        std: per-channel standard deviation of that normalisation, likewise (1 where none).
        optimizer: any torch optimizer and its arguments, the learning rate among them
            (`--model.optimizer SGD --model.optimizer.lr 0.05`, or LightningCLI's `--optimizer`).
        scheduler: the learning-rate schedule; one that takes `total_steps` (`--model.scheduler
            OneCycle`) is planned over the run's optimizer steps and stepped every step, others
            every epoch (ReduceLROnPlateau on its `monitor`); null: constant.
        label_smoothing: of the training loss, in [0, 1] (evaluation losses use none).
        mixup: alpha of torchvision's MixUp of training batches (0: off); training accuracy counts
            a prediction by its class's share of the mixed label.
        cutmix: alpha of torchvision's CutMix (0: off); with mixup, each batch takes one of the two.
        flip_test: when evaluating (validation, test, predict, `classify`, exports), average the
            logits of each image and its mirror image (for data whose classes survive a flip).
        translate_test: and of each image shifted this many pixels both ways (test_time); 0: off.
        channels_last: the NHWC memory layout for convolutional networks (faster on GPUs, CPUs).
        compile: `torch.compile` the network: true, or a mode ("reduce-overhead", "max-autotune").
    """

    takes_uint8_images = True  # ImageDataModule.gives_floats reads it: uint8 in, normalised here
    # Python's alone: torch.jit.script (`to_torchscript()`) leaves them out, as LightningModule's.
    __jit_unused_properties__ = [*L.LightningModule.__jit_unused_properties__, "net_name", "lr",
                                 "backbone", "class_names", "per_step_schedule"]

    def __init__(self, net: Optional[parts.NetworkCallable] = None,
                 image_shape: Optional[tuple[int, int, int]] = None,
                 num_classes: Optional[int] = None, class_names: Optional[list[str]] = None,
                 mean: Optional[list[float]] = None, std: Optional[list[float]] = None,
                 optimizer: OptimizerCallable = torch.optim.AdamW,
                 scheduler: Optional[LRSchedulerCallable] = None, label_smoothing: float = 0.0,
                 mixup: float = 0.0, cutmix: float = 0.0, flip_test: bool = False,
                 translate_test: int = 0, channels_last: bool = True,
                 compile: Union[bool, Literal["reduce-overhead", "max-autotune"]] = False):
        super().__init__()
        checks.check_arguments(label_smoothing, mixup, cutmix, translate_test)
        net = TutorialCNN if net is None else net
        self.net_factory = parts.as_factory(net)
        self.optimizer_factory = parts.as_factory(optimizer)
        self.scheduler_factory = parts.as_factory(scheduler)
        # As data (as_spec), read by save_hyperparameters: a checkpoint rebuilds the same parts.
        net, optimizer, scheduler = map(parts.as_spec, (net, optimizer, scheduler))
        self.save_hyperparameters()
        self.flip_test, self.translate_test = flip_test, translate_test  # scripted forward's
        self.net = None
        self.resuming: dict | None = None  # the checkpoint a fit goes on from
        self.resumed: resume.Resumption | None = None  # and how
        for name in ("val_loss", "val_acc", "test_loss", "test_acc"):  # per image: exact means
            setattr(self, name, MeanMetric(nan_strategy="disable"))
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # in checkpoints: a resumed run remembers its best epoch
        # Training loss and accuracy summed since last logged (logs_at), and their epoch means:
        # metrics of sums over all processes already (a sync when one process's progress bar reads
        # them would hang DDP: Lightning-AI/pytorch-lightning#21264).
        self.train_window = torch.zeros(2)  # float32 whatever --trainer.precision says
        self.window_images = 0
        self.train_loss = MeanMetric(nan_strategy="disable", sync_on_compute=False)
        self.train_acc = MeanMetric(nan_strategy="disable", sync_on_compute=False)
        if image_shape is not None and num_classes is not None:
            self._build()

    @property
    def net_name(self) -> str:
        """The network's short name (NETWORKS), or its class name."""
        return parts.network_name(self.net, self.hparams.net)

    @property
    def lr(self) -> float:
        """The optimizer's learning rate: what Lightning's learning-rate finder reads and sets."""
        return parts.learning_rate(self.optimizer_factory)

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer_factory = parts.with_learning_rate(self.optimizer_factory, value)
        self.hparams.optimizer = parts.with_learning_rate(self.hparams.optimizer, value)

    def _build(self) -> None:
        hp = self.hparams
        net = parts.build_network(self.net_factory, hp.net, hp.image_shape, hp.num_classes)
        convolutional = any(isinstance(m, torch.nn.Conv2d) for m in net.modules())
        self.uses_channels_last = hp.channels_last and convolutional
        if self.uses_channels_last:
            net = net.to(memory_format=torch.channels_last)
        if hp.compile:  # in place: state_dict keys stay the same
            net.compile(mode=None if hp.compile is True else hp.compile)
        else:  # for the model summary and TensorBoard's graph (a compiled network cannot be traced)
            self.example_input_array = torch.zeros(1, *hp.image_shape, dtype=torch.uint8)
        self.net = net
        # Buffers, so that the normalisation travels with the weights (and a loaded checkpoint's
        # wins); until the data module gives its statistics (take_from_data), none.
        self.register_buffer("mean", torch.zeros(1, hp.image_shape[0], 1, 1))
        self.register_buffer("std", torch.ones(1, hp.image_shape[0], 1, 1))
        self._set_normalisation()
        self.test_confusion = MulticlassConfusionMatrix(hp.num_classes, validate_args=False)

    def _set_normalisation(self) -> None:
        hp = self.hparams
        if hp.mean is None or hp.std is None:
            return
        checks.check_normalisation(hp.mean, hp.std, hp.image_shape)
        self.mean.copy_(torch.tensor(hp.mean).view(1, -1, 1, 1))
        self.std.copy_(torch.tensor(hp.std).view(1, -1, 1, 1))

    def take_from_data(self, data, statistics: bool = True) -> None:
        """Take what was not given (image shape, classes, class names; with `statistics`, the
        training images' mean and std, which reads them) from the data module `data`, and build the
        network if it is not built yet. The hyperparameters, and so hparams.yaml and TensorBoard's
        HParams, then hold the values the model uses. A data module that does not say the image
        shape or the classes is told, in one line, the options that give them."""
        hp = self.hparams
        facts = {"image_shape": "image_shape", "num_classes": "num_classes",
                 "class_names": "classes"}
        if statistics:
            facts.update(mean="mean", std="std")
        for name, attribute in facts.items():
            if hp[name] is None and hasattr(data, attribute):
                hp[name] = getattr(data, attribute)
        if hp.class_names is not None:
            hp.class_names = list(hp.class_names)
        if hp.num_classes is None and hp.class_names is not None:
            hp.num_classes = len(hp.class_names)
        checks.check_facts(data, hp)
        if statistics and hp.mean is None:  # a data module that says none: uint8 images /255
            hp.mean, hp.std = [0.0] * hp.image_shape[0], [1.0] * hp.image_shape[0]
        if self.net is None:
            self._build()
        self._set_normalisation()  # a built network's (a new one has it already: the same)
        # What Lightning logs is the model's initial hyperparameters.
        self.save_hyperparameters(dict(hp))

    @property
    def backbone(self) -> torch.nn.Module:
        """The network but its last layer, which BackboneFinetuning freezes and thaws."""
        if not isinstance(self.net, torch.nn.Sequential):
            raise ModelError(f"BackboneFinetuning takes the layers but the last of an "
                             f"nn.Sequential network as its backbone; {self.net_name} is not one: "
                             f"give your model a `backbone`")
        layers = list(self.net.named_children())[:-1]
        return torch.nn.Sequential(OrderedDict(layers))  # the same layers

    @property
    def class_names(self) -> list[str]:
        """The names of the classes: the data module's, or their numbers."""
        return list(self.hparams.class_names or map(str, range(self.hparams.num_classes)))

    def setup(self, stage: str) -> None:
        """Refuse data the model was not built for."""
        data = self.trainer.datamodule
        if self.net is not None and data is not None:
            checks.check_data(self, data)
        if stage == "fit":
            self.resuming = self.resumed = None  # until a checkpoint says how a fit goes on
        if stage == "fit" and self.per_step_schedule:
            checks.check_planned_schedule(self.trainer.callbacks)

    def configure_model(self) -> None:
        """Take what the model lacks from the data module: the network if it is not built yet, and
        the normalisation statistics. Lightning calls this hook after prepare_data and setup, before
        it logs the hyperparameters and configures the optimizers; train.py builds the network
        before (take_from_data), for the callbacks that copy the model in their setup."""
        if self.net is not None and self.hparams.mean is not None:
            return
        checks.check_can_build(self.trainer, self.net)
        if self.trainer.datamodule is not None:
            self.take_from_data(self.trainer.datamodule)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) for images (N, C, H, W): uint8 ones normalised here, float ones
        as they are."""
        flip, shift = self.flip_test, self.translate_test
        if not torch.jit.is_scripting():  # hparams are Python's; scripted, the model is built
            checks.check_ready(self.net)
            flip, shift = self.hparams.flip_test, self.hparams.translate_test  # as set, loaded too
        x = images
        if not images.is_floating_point():
            scale = 1 / (255 * self.std)  # (x / 255 - mean) / std as one multiply-add per element
            x = torch.addcmul(-self.mean / self.std, images.to(scale.dtype), scale)
        if self.uses_channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.training or not (flip or shift):
            return self.net(x)
        return test_time.averaged([self.net(v) for v in test_time.views(x, flip, shift)], flip)

    def classify(self, images) -> torch.Tensor:
        """Class probabilities (N, num_classes) for a uint8 batch (N, C, H, W), a PIL image, or a
        list of them (decoded as the image-folder data module decodes files, resized to fit):

            path = "lightning_logs/version_0/checkpoints/last.ckpt"
            model = ImageClassifier.load_from_checkpoint(path)
            probabilities = model.classify(PIL.Image.open("cat.png"))
        """
        return predict.classify(self, images)

    def logs_at(self, batch_idx: int) -> bool:
        """Whether a training step logs train/loss and train/acc (the means since the last time):
        where Lightning's loggers write a step, before a validation, at an epoch's end (a
        `self.log` a step costs: docs/design.md)."""
        trainer, every = self.trainer, self.trainer.log_every_n_steps
        logger_step = bool(every and (trainer.global_step + 1) % every == 0)
        epoch_end = batch_idx + 1 == trainer.num_training_batches
        before_validation = (batch_idx + 1) % (trainer.val_check_batch or float("inf")) == 0
        return logger_step or epoch_end or before_validation

    def training_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss the optimizer minimises: cross-entropy with label smoothing. `targets` are class
        indices (N,), or class probabilities (N, classes) under mixup or cutmix. A subclass
        overrides it for another loss."""
        return F.cross_entropy(logits, targets, label_smoothing=self.hparams.label_smoothing)

    def mix(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """torchvision's MixUp or CutMix of a batch and its labels (parts.mixed), seeded by the
        seed, the step and the rank: a resumed run mixes as an uninterrupted one does."""
        seed = mix_seed(torch.initial_seed(), self.global_step, self.global_rank)
        hp = self.hparams
        return parts.mixed(images, labels, hp.mixup, hp.cutmix, hp.num_classes, seed)

    def training_step(self, batch, batch_idx):
        """The training loss of a batch; its sums join the window that `logs_at` logs."""
        images, labels = batch
        targets = labels
        if self.hparams.mixup or self.hparams.cutmix:
            images, targets = self.mix(images, labels)
        logits = self(images)
        loss = self.training_loss(logits, targets)
        predicted = logits.argmax(1)
        if targets.dim() == 1:
            correct = predicted == targets
        else:  # mixed labels: a prediction counts by its class's share of the label
            correct = targets.gather(1, predicted[:, None])
        self.train_window = self.train_window.to(loss.device)  # a no-op but on the first step
        sums = torch.stack([loss.detach(), correct.float().mean()]).float() * len(labels)
        self.train_window += sums
        self.window_images += len(labels)
        if self.logs_at(batch_idx):
            self._log_train_window()
        return loss

    def _log_train_window(self) -> None:
        # Every process logs at the same steps: their sums, added up here, are the images of all
        # of them.
        window = torch.cat([self.train_window, self.train_window.new_tensor([self.window_images])])
        loss_sum, acc_sum, images = self.trainer.strategy.reduce(window, reduce_op="sum")
        self.train_loss(loss_sum / images, weight=images)
        self.train_acc(acc_sum / images, weight=images)
        self.log_dict({"train/loss": self.train_loss, "train/acc": self.train_acc},
                      on_step=True, on_epoch=True, prog_bar=True)
        self.train_window.zero_()
        self.window_images = 0

    def on_train_epoch_end(self):
        checks.check_finite(self.net, self.current_epoch, self.global_step)

    def on_save_checkpoint(self, checkpoint):
        # No checkpoint ever holds the weights of a diverged run.
        checks.check_finite(self.net, self.current_epoch, self.global_step)
        checkpoint["train_window"] = [*self.train_window.tolist(), self.window_images]

    def on_load_checkpoint(self, checkpoint):
        *window, self.window_images = checkpoint.get("train_window", [0.0, 0.0, 0])
        self.train_window = torch.tensor(window)
        try:
            trainer = self.trainer
        except RuntimeError:  # not attached to a Trainer: load_from_checkpoint, whose `strict`
            trainer = None  # refuses or allows missing and unexpected weights
        # Before Lightning loads them: their shapes and values, and as a Trainer loads them
        # (`strict_loading`), their names.
        strict = trainer is not None and self.strict_loading
        checks.check_weights(self, checkpoint.get("state_dict", {}), strict)
        if trainer is not None and trainer.training:
            # What Lightning restores next, once the optimizers are made (configure_optimizers
            # says how the fit goes on; the data module's position is restored only then).
            self.resuming = checkpoint

    def _evaluate(self, batch, stage: str) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss, acc = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        # Per image: exact means, the last batch too.
        loss.update(F.cross_entropy(logits, labels, reduction="none"))
        acc.update((logits.argmax(1) == labels).float())
        self.log_dict({f"{stage}/loss": loss, f"{stage}/acc": acc}, on_epoch=True,
                      prog_bar=stage == "val")
        return logits

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:  # the untrained model is no one's best epoch
            return
        self.val_acc_best.update(self.val_acc.compute())
        best = self.val_acc_best.compute()
        # hp_metric: what TensorBoard's HParams tab compares runs by. The same value on every
        # process (from the synced val/acc): sync_dist only keeps Lightning from warning that it
        # might not be.
        self.log_dict({"val/acc_best": best, "hp_metric": best}, prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.test_confusion.update(self._evaluate(batch, "test"), batch[1])

    def on_test_epoch_end(self):
        confusion = self.test_confusion.compute()  # rows: true class, columns: predicted
        self.test_confusion.reset()
        per_class = confusion.diag() / confusion.sum(1)  # NaN for a class without test images
        names = class_metrics(self.class_names, "test")  # tags TensorBoard takes
        self.log_dict(dict(zip(names, per_class)), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        """Class probabilities for a batch of images, or of (images, labels)."""
        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(images).softmax(1)

    @property
    def per_step_schedule(self) -> bool:
        """Whether the schedule is planned over the run's steps (OneCycle: `total_steps`)."""
        return parts.plans_over_run(self.scheduler_factory)

    def on_fit_start(self):
        checks.outside_inference_mode(self)  # after a `trainer.validate` or `test` from Python
        # A learning-rate finder (LearningRateFinder, after the optimizers were made) set a new
        # rate: the optimizers and schedule again, for it, and it in the hyperparameters logged.
        if self.lr != self.planned_lr:
            self.trainer.strategy.setup_optimizers(self.trainer)
            self.save_hyperparameters(dict(self.hparams))

    def run_steps(self) -> int | None:
        """The run's optimizer steps, where the schedule is planned over them (OneCycle)."""
        if not self.per_step_schedule:
            return None
        steps = self.trainer.estimated_stepping_batches
        if steps == float("inf"):
            raise ModelError("a schedule over the whole run needs --trainer.max_epochs or "
                             "--trainer.max_steps")
        return max(1, int(steps))

    def configure_optimizers(self):
        self.planned_lr = self.lr
        # Frozen parameters (a backbone's) join later.
        trained = [p for p in self.parameters() if p.requires_grad]
        optimizer = parts.build_optimizer(self.optimizer_factory, trained)
        steps = self.run_steps()
        if self.resuming is not None:  # a fit from a checkpoint: how it goes on
            self.resumed = resume.plan(self.resuming, self.hparams, steps)
            self.resuming = None
        resume.load_state(optimizer, self.resumed)
        configured = schedules.configured(self.scheduler_factory, optimizer, steps, self.resumed)
        if self.resumed is not None:  # how the fit goes on, once the schedule is made
            rank_zero_only(print)(f"Resumed: {self.resumed.said()}", file=sys.stderr)
        return configured
