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


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


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
        # logger=False: TensorBoardDashboards writes them, with the metrics they are judged by.
        self.save_hyperparameters(logger=False)
        self.net = NETWORKS[arch](tuple(image_shape), num_classes)
        # For the TensorBoard graph, which is traced with torch.jit: a compiled network cannot be.
        self.example_input_array = None if compile else torch.zeros(1, *image_shape)
        self.class_names = class_names or [str(i) for i in range(num_classes)]
        self.uses_channels_last = channels_last and any(isinstance(m, nn.Conv2d) for m in self.net.modules())
        if self.uses_channels_last:
            self.net.to(memory_format=torch.channels_last)
        if compile:
            # In place, so that state_dict keys (and so checkpoints) match an uncompiled network.
            self.net.compile()
        # Training loss and accuracy are running sums on the device, reduced across ranks once per
        # epoch: a torchmetrics update costs ~4x these two in-place adds, which measured as 9% of the
        # MLP's training throughput on a CPU. Evaluation, which runs far fewer steps, uses torchmetrics.
        self.register_buffer("train_loss_sum", torch.zeros(()), persistent=False)
        self.register_buffer("train_correct", torch.zeros((), dtype=torch.long), persistent=False)
        self.train_samples = 0
        # The first global step whose loss was NaN or infinite (-1: none yet), tracked on the device
        # and looked at once per epoch, before anything is checkpointed.
        self.register_buffer("first_nonfinite_step", torch.full((), -1, dtype=torch.long), persistent=False)
        self.register_buffer("step_count", torch.zeros((), dtype=torch.long), persistent=False)
        # A separate metric object per stage, as torchmetrics wants; all are synced across DDP ranks.
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # in checkpoints, so that a resumed run remembers its best
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
        # No self.log here: on a CPU each call costs ~0.2 ms a step, a tenth of the MLP's step.
        # No .item() either: the sums stay on the device until the epoch ends.
        self.train_loss_sum += loss.detach() * len(y)
        self.train_correct += (logits.argmax(1) == y).sum()
        self.train_samples += len(y)
        first_bad = torch.isfinite(loss.detach()) | (self.first_nonfinite_step >= 0)
        self.first_nonfinite_step = torch.where(first_bad, self.first_nonfinite_step, self.step_count)
        self.step_count += 1
        return loss

    def on_train_epoch_start(self):
        self.step_count.fill_(self.trainer.global_step)

    def _stop_on_nonfinite_loss(self):
        # max over ranks: every rank stops together, naming the step one of them saw first.
        step = int(self.trainer.strategy.reduce(self.first_nonfinite_step.clone(), reduce_op="max"))
        if step >= 0:
            raise NonFiniteLossError(
                f"the training loss became NaN or infinite at epoch {self.current_epoch}, step {step}; "
                f"nothing after it was checkpointed. Try a lower --model.lr.")

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self._stop_on_nonfinite_loss()  # before validation ends and checkpoints are written

    def on_train_epoch_end(self):
        self._stop_on_nonfinite_loss()
        sums = torch.stack([self.train_loss_sum, self.train_correct.to(self.train_loss_sum.dtype),
                            torch.tensor(float(self.train_samples), device=self.device)])
        sums = self.trainer.strategy.reduce(sums, reduce_op="sum")  # all ranks' samples
        # Already totals over all ranks; sync_dist only tells Lightning so (it averages equal values).
        self.log_dict({"train/loss": sums[0] / sums[2], "train/acc": sums[1] / sums[2]}, sync_dist=True)
        self.train_loss_sum.zero_()
        self.train_correct.zero_()
        self.train_samples = 0

    def _evaluate(self, batch, loss_metric):
        x, y = batch
        logits = self(x)
        loss_metric.update(F.cross_entropy(logits, y), weight=len(y))
        return logits, y

    def validation_step(self, batch, batch_idx):
        logits, y = self._evaluate(batch, self.val_loss)
        self.val_acc.update(logits, y)

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:  # the untrained model is no one's best epoch
            self.val_acc_best.update(self.val_acc.compute())
            self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)
        self.log_dict({"val/loss": self.val_loss, "val/acc": self.val_acc}, prog_bar=True)

    def test_step(self, batch, batch_idx):
        logits, y = self._evaluate(batch, self.test_loss)
        self.test_confusion.update(logits, y)

    def on_test_epoch_end(self):
        confusion = self.test_confusion.compute()
        self.test_confusion.reset()
        correct, per_class_total = confusion.diag(), confusion.sum(1)
        self.log("test/loss", self.test_loss)
        # Computed from the synced confusion matrix; sync_dist only tells Lightning so.
        self.log_dict({"test/acc": correct.sum() / confusion.sum(), "test/samples": confusion.sum().float()},
                      sync_dist=True)
        per_class = correct / per_class_total.clamp(min=1)
        self.log_dict({f"test/acc_class/{name}": acc for name, acc in zip(self.class_names, per_class)},
                      sync_dist=True)
        self.test_per_class_acc = dict(zip(self.class_names, per_class.tolist()))
        self.test_confusion_matrix = confusion.cpu()  # rows: true class, columns: predicted

    def configure_optimizers(self):
        return make_optimizer(self.parameters(), self.hparams, self.trainer.estimated_stepping_batches)


def make_optimizer(params, hparams, total_steps: int) -> dict:
    """The recipe's optimizer and per-step LR schedule, as `configure_optimizers` returns them."""
    params = list(params)
    # One fused kernel per step instead of a Python loop over the parameters: on a CPU, AdamW's step
    # for the MLP took 60 µs instead of 160, SGD's for the CNN 43 µs instead of 116.
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    if hparams.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=hparams.lr, momentum=hparams.momentum,
                              nesterov=hparams.momentum > 0, weight_decay=hparams.weight_decay, fused=fused)
    else:
        opt = torch.optim.AdamW(params, lr=hparams.lr, weight_decay=hparams.weight_decay, fused=fused)
    if hparams.schedule == "constant":
        return {"optimizer": opt}
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=hparams.lr, total_steps=total_steps,
                                                pct_start=hparams.warmup)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
