"""One LightningModule for image classification: loss, metrics and optimisation around a network."""

from typing import Literal, Optional

import lightning as L
import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, PositiveFloat
from torch import nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from lit_models.networks import NETWORKS


class ImageClassifier(L.LightningModule):
    """Cross-entropy classifier around one of the tutorials' networks (`--model cnn`, `--model mlp`).

    The defaults are the fast CNN recipe; `configs/cnn.yaml` and `configs/mlp.yaml` hold both recipes.
    `image_shape`, `num_classes` and `class_names` come from the data module (linked by the CLI).

    Args:
        arch: which network to train: the CIFAR-10 tutorial's CNN or the MNIST tutorial's MLP.
        image_shape: (channels, height, width) of the input images.
        num_classes: number of classes.
        class_names: names of the classes, for per-class test accuracy.
        lr: peak learning rate (the OneCycle maximum, or the constant rate).
        optimizer: "sgd" (momentum, Nesterov) or "adamw". LightningCLI's `--optimizer` replaces this
            whole recipe with any torch optimizer (as the seed configs do).
        momentum: SGD momentum.
        weight_decay: L2 penalty (SGD) or decoupled weight decay (AdamW).
        schedule: "onecycle" (warm up, then anneal to ~0 by the last step) or "constant".
        warmup: fraction of the steps spent warming up in the OneCycle schedule.
        label_smoothing: label smoothing of the training loss (validation and test loss use none).
        channels_last: use the NHWC memory layout for convolutions (faster on GPUs and CPUs alike).
        compile: compile the network with `torch.compile`.
    """

    def __init__(
        self,
        arch: Literal["cnn", "mlp"] = "cnn",
        image_shape: tuple[int, int, int] = (3, 32, 32),
        num_classes: int = 10,
        class_names: Optional[list[str]] = None,
        lr: PositiveFloat = 0.05,
        optimizer: Literal["sgd", "adamw"] = "sgd",
        momentum: NonNegativeFloat = 0.9,
        weight_decay: NonNegativeFloat = 5e-4,
        schedule: Literal["onecycle", "constant"] = "onecycle",
        warmup: float = 0.25,
        label_smoothing: float = 0.1,
        channels_last: bool = True,
        compile: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = NETWORKS[arch](tuple(image_shape), num_classes)
        self.class_names = class_names or [str(i) for i in range(num_classes)]
        self.uses_channels_last = channels_last and any(isinstance(m, nn.Conv2d) for m in self.net.modules())
        if self.uses_channels_last:
            self.net.to(memory_format=torch.channels_last)
        if compile:
            # In place, so that state_dict keys (and so checkpoints) match an uncompiled network.
            self.net.compile()
        # A separate metric object per stage, as torchmetrics wants; all are synced across DDP ranks.
        self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        # validate_args=False: the per-step input checks cost more than the update itself.
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc_best = MaxMetric()
        # The confusion matrix gives test accuracy, per-class accuracy and the sample count at once.
        self.test_confusion = MulticlassConfusionMatrix(num_classes, validate_args=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.uses_channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, label_smoothing=self.hparams.label_smoothing)
        # Only metric updates here, no self.log: on the CPU each self.log call costs ~0.2 ms a step,
        # a fifth of the MLP's step time. The epoch values are logged in on_train_epoch_end.
        self.train_loss.update(loss.detach(), weight=len(y))
        self.train_acc.update(logits.detach(), y)
        return loss

    def on_train_start(self):
        # The sanity-check validation must not count as the best epoch.
        self.val_acc_best.reset()

    def on_train_epoch_end(self):
        self.log_dict({"train/loss": self.train_loss, "train/acc": self.train_acc})

    def _evaluate(self, batch, loss_metric):
        x, y = batch
        logits = self(x)
        loss_metric.update(F.cross_entropy(logits, y), weight=len(y))
        return logits, y

    def validation_step(self, batch, batch_idx):
        logits, y = self._evaluate(batch, self.val_loss)
        self.val_acc.update(logits, y)

    def on_validation_epoch_end(self):
        acc = self.val_acc.compute()
        self.val_acc_best.update(acc)
        self.log_dict({"val/loss": self.val_loss, "val/acc": self.val_acc}, prog_bar=True)
        self.log("val/acc_best", self.val_acc_best.compute())

    def test_step(self, batch, batch_idx):
        logits, y = self._evaluate(batch, self.test_loss)
        self.test_confusion.update(logits, y)

    def on_test_epoch_end(self):
        confusion = self.test_confusion.compute()
        self.test_confusion.reset()
        correct, per_class_total = confusion.diag(), confusion.sum(1)
        self.log_dict({
            "test/loss": self.test_loss,
            "test/acc": correct.sum() / confusion.sum(),
            "test/samples": confusion.sum().float(),
        })
        per_class = correct / per_class_total.clamp(min=1)
        self.log_dict({f"test/acc_class/{name}": acc for name, acc in zip(self.class_names, per_class)})
        self.test_per_class_acc = dict(zip(self.class_names, per_class.tolist()))

    def configure_optimizers(self):
        hp = self.hparams
        if hp.optimizer == "sgd":
            opt = torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=hp.momentum,
                                  nesterov=hp.momentum > 0, weight_decay=hp.weight_decay)
        else:
            opt = torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.schedule == "constant":
            return opt
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=hp.lr, total_steps=self.trainer.estimated_stepping_batches, pct_start=hp.warmup)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
