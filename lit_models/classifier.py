"""One LightningModule for image classification: loss, metrics and optimisation around a network."""

import math
from typing import Literal, Optional, Union

import lightning as L
import torch
import torch.nn.functional as F
from jsonargparse.typing import ClosedUnitInterval, PositiveInt
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from lit_models.networks import NETWORKS
from lit_models.preprocessing import Uint8Normalize, to_uint8_batch


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


class ImageClassifier(L.LightningModule):
    """Cross-entropy classifier around one of the tutorials' networks (`--model cnn`, `--model mlp`).

    The recipes (`configs/cnn.yaml`, `configs/mlp.yaml`) set the optimizer and schedule; without one,
    AdamW at its defaults with a constant learning rate. `image_shape`, `num_classes`, `class_names`,
    `mean`, `std` come from the data module and `accumulate_grad_batches` from the trainer (linked by the
    CLI), so that a checkpoint carries everything needed to use the model again.

    Each training step of Lightning is a *call* of this module on a chunk of K batches
    (`--data.steps_per_call`): K forward/backward/optimizer steps with Lightning's manual optimization,
    the LR schedule stepped after each. Lightning's fixed cost per step is paid once per K steps.
    `trainer.global_step` counts optimizer steps, as it does without chunks.

    Args:
        arch: which network to train: the CIFAR-10 tutorial's CNN or the MNIST tutorial's MLP.
        image_shape: (channels, height, width) of the input images.
        num_classes: number of classes.
        class_names: names of the classes (per-class accuracy, predictions).
        mean: per-channel mean of the training images on the 0..1 scale (the input normalisation).
        std: per-channel standard deviation, likewise.
        optimizer: any torch optimizer and its arguments, e.g. `--model.optimizer SGD
            --model.optimizer.lr 0.05` (`--model.optimizer.help SGD` lists them).
        scheduler: the learning-rate schedule, stepped after every optimizer step and called with the
            run's number of optimizer steps (`--model.scheduler OneCycle`); none: a constant rate.
        label_smoothing: label smoothing of the training loss, in [0, 1] (evaluation losses use none).
        channels_last: use the NHWC memory layout for convolutions (faster on GPUs and CPUs alike).
        compile: compile the network with `torch.compile`: true, or a mode: "reduce-overhead" (on a GPU, CUDA
            graphs of the network's forward and backward, which every training batch, of one shape, replays:
            the launch cost of the tutorial networks' many small kernels is paid once), "max-autotune".
        accumulate_grad_batches: batches whose gradients are summed per optimizer step (linked from
            `--trainer.accumulate_grad_batches`).
    """

    def __init__(
        self,
        arch: Literal["cnn", "mlp"] = "cnn",
        image_shape: tuple[PositiveInt, PositiveInt, PositiveInt] = (3, 32, 32),
        num_classes: PositiveInt = 10,
        class_names: Optional[list[str]] = None,
        mean: Optional[list[float]] = None,
        std: Optional[list[float]] = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: Optional[LRSchedulerCallable] = None,
        label_smoothing: ClosedUnitInterval = 0.0,
        channels_last: bool = True,
        compile: Union[bool, Literal["reduce-overhead", "max-autotune"]] = False,
        accumulate_grad_batches: PositiveInt = 1,
    ):
        super().__init__()
        # logger=False: TensorBoardDashboards writes them, with the metrics they are judged by.
        self.save_hyperparameters(logger=False)
        self.automatic_optimization = False  # K optimizer steps per call: see training_step
        self.net = NETWORKS[arch](tuple(image_shape), num_classes)
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.accumulate_grad_batches = accumulate_grad_batches
        channels = image_shape[0]
        self.normalize = Uint8Normalize(mean or [0.0] * channels, std or [1.0] * channels)
        # For the TensorBoard graph, which is traced with torch.jit: a compiled network cannot be.
        self.example_input_array = None if compile else torch.zeros(1, *image_shape)
        self.class_names = class_names or [str(i) for i in range(num_classes)]
        self.uses_channels_last = channels_last and any(isinstance(m, nn.Conv2d) for m in self.net.modules())
        if self.uses_channels_last:
            self.net.to(memory_format=torch.channels_last)
        if compile:
            # In place, so that state_dict keys (and so checkpoints) match an uncompiled network.
            self.net.compile(mode=None if compile is True else compile)
        # The best validation accuracy so far, in checkpoints so that a resumed run remembers it.
        self.register_buffer("val_acc_best", torch.tensor(float("nan")))
        # A separate metric object per stage, as torchmetrics wants; each syncs across DDP ranks when
        # computed, which happens on every rank in the same hook (never in the progress bar: see _log).
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        # The confusion matrix gives test accuracy, per-class accuracy and the sample count at once.
        self.test_confusion = MulticlassConfusionMatrix(num_classes, validate_args=False)
        self.lr_history: list[tuple[int, dict[str, float]]] = []  # (optimizer step, {name: lr}), for the logger
        self._direct_steps = False  # see on_train_start
        self._reset_epoch()

    # --- using the model ---------------------------------------------------------------------------

    @property
    def example_input_array(self):
        """The input that the model summary and the TensorBoard graph run the network on, in the type of its
        weights: Lightning passes it as it is, and a 64-true or bf16-true network would fail on float32."""
        example = self._example_input_array
        parameter = next(self.parameters(), None)
        return example if example is None or parameter is None else example.to(parameter.dtype)

    @example_input_array.setter
    def example_input_array(self, example):
        self._example_input_array = example

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of normalised float images (N, C, H, W)."""
        if self.uses_channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    @torch.no_grad()
    def classify(self, images) -> torch.Tensor:
        """Class probabilities (N, num_classes) for uint8 images (N, C, H, W), a PIL image, or a list of them.

        PIL images are converted to the model's channels and resized and centre-cropped to its input size;
        everything is normalised with the training set's statistics stored in the model:

            model = ImageClassifier.load_from_checkpoint("lightning_logs/cnn-cifar10/version_0/checkpoints/last.ckpt")
            probabilities = model.classify(PIL.Image.open("cat.png"))
        """
        was_training = self.training
        self.eval()
        try:
            x = to_uint8_batch(images, tuple(self.hparams.image_shape)).to(self.device)
            return self(self.normalize(x)).softmax(1)
        finally:
            self.train(was_training)

    # --- training: K optimizer steps per call --------------------------------------------------------

    def training_step(self, chunk, chunk_idx):
        """Forward, backward and an optimizer step for each batch of the chunk.

        The same steps in the same order as a loop over single batches: with the same seed, any
        `steps_per_call` ends with the same weights. Nothing here waits for the device: the losses
        and correct counts stay on it until the epoch ends.
        """
        trainer = self.trainer
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        accumulate, smoothing = self.accumulate_grad_batches, self.hparams.label_smoothing
        last_chunk = chunk_idx == trainer.num_training_batches - 1
        max_steps, log_every = trainer.max_steps, trainer.log_every_n_steps
        micro_batches = self._micro_batches  # a local: nn.Module attribute writes cost microseconds each
        # Lightning converts the inputs of a list for "true" precisions (64-true, bf16-true); a lazy chunk's
        # batches are made here, so they are converted here.
        convert = None if isinstance(chunk, list) else trainer.precision_plugin.convert_input
        for i, (x, y) in enumerate(chunk):
            step = trainer.global_step
            if 0 <= max_steps <= step:
                break
            if convert is not None:
                x = convert(x)
            logits = self(x)
            loss = F.cross_entropy(logits, y, label_smoothing=smoothing)
            self._losses.append(loss.detach())
            self._correct.append((logits.argmax(1) == y).sum())
            self._loss_steps.append(step)
            self._batch_sizes.append(len(y))
            micro_batches += 1
            # Steps every `accumulate` batches and at the end of the epoch, as Lightning does.
            steps = micro_batches % accumulate == 0 or (last_chunk and i == len(chunk) - 1)
            if accumulate == 1:
                self._backward(loss)
            else:
                with optimizer.toggle_model(sync_grad=steps):  # DDP all-reduces only on the stepping batch
                    self._backward(loss / accumulate)
            if steps:
                if step % log_every == 0:
                    self.lr_history.append((step, {f"lr-{type(optimizer.optimizer).__name__}":
                                                   optimizer.param_groups[0]["lr"]}))
                self._optimizer_step(optimizer)
                optimizer.zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
        self._micro_batches = micro_batches
        if last_chunk or 0 <= trainer.max_steps <= trainer.global_step:
            self._finish_epoch()  # before validation, and so before any checkpoint of this epoch

    # manual_backward and LightningOptimizer.step call Lightning's per-step hooks (on_before_backward,
    # on_after_backward, on_before_optimizer_step) on every callback and on this module: ~0.1 ms a step on a
    # CPU, more than a whole step of the tutorial networks on a GPU. When nothing listens to those hooks and
    # no gradient scaler is involved, the step calls what they wrap directly: the strategy's backward
    # preparation (DDP's all-reduce), the backward pass, the optimizer, and Lightning's count of optimizer
    # steps (trainer.global_step).
    def on_train_start(self):
        hooks = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
        listened = any(is_overridden(hook, callback, L.Callback) for callback in self.trainer.callbacks
                       for hook in hooks) or any(is_overridden(hook, self, L.LightningModule) for hook in hooks)
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None
        self._direct_steps = not listened and not scaled

    def _backward(self, loss: torch.Tensor) -> None:
        if not self._direct_steps:
            self.manual_backward(loss)
            return
        strategy = self.trainer.strategy
        strategy.pre_backward(loss)
        loss.backward()
        strategy.post_backward(loss)

    def _optimizer_step(self, optimizer) -> None:
        if not self._direct_steps:
            optimizer.step()
            return
        optimizer._on_before_step()  # what LightningOptimizer.step does around the step, for global_step
        optimizer.optimizer.step()
        optimizer._on_after_step()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # Lightning counts one logging step per call; with K optimizer steps a call, TensorBoard's x-axis
        # would count calls. It adds 1 after this hook: make its counter the optimizer steps.
        self.trainer.fit_loop.epoch_loop._batches_that_stepped = self.trainer.global_step - 1

    def on_train_epoch_start(self):
        self._reset_epoch()

    def on_train_epoch_end(self):
        self._finish_epoch()  # for an epoch cut short (max_steps, a stop): training_step did not

    def _reset_epoch(self):
        self._losses, self._correct, self._loss_steps, self._batch_sizes = [], [], [], []
        self._micro_batches = 0
        self._epoch_finished = False

    def _finish_epoch(self):
        """Train loss and accuracy of the epoch over all ranks; stop if a loss was NaN or infinite.

        One device sync and one collective per epoch, made by every rank in the same place.
        """
        if self._epoch_finished or not self._losses:
            return
        self._epoch_finished = True
        losses = torch.stack(self._losses)
        bad = ~torch.isfinite(losses)
        first_bad = torch.where(bad.any(), bad.float().argmax(), -1)
        local = torch.stack([losses.sum(), torch.stack(self._correct).sum().to(losses.dtype),
                             torch.tensor(float(sum(self._batch_sizes)), device=losses.device),
                             torch.tensor(float(len(self._losses)), device=losses.device), first_bad.float()])
        gathered = self.trainer.strategy.all_gather(local).reshape(-1, 5).cpu()  # (ranks, 5)
        # Every rank runs the same steps, so a batch index names the same optimizer step on all of them.
        bad = [int(i) for i in gathered[:, 4].tolist() if i >= 0]
        if bad:
            raise NonFiniteLossError(
                f"the training loss became NaN or infinite at epoch {self.current_epoch}, step "
                f"{self._loss_steps[min(bad)]}; "
                f"nothing after it was checkpointed. Try a lower learning rate (--model.optimizer.lr).")
        loss_sum, correct, samples, batches = gathered[:, :4].sum(0).tolist()
        # Full batches only, so the mean of the batch means is the mean over the images.
        self._log({"train/loss": loss_sum / batches, "train/acc": correct / samples}, prog_bar=True)

    def _log(self, metrics: dict, prog_bar: bool = False):
        # Every value is already reduced over the ranks, in a hook that all of them run: no sync_dist. With
        # it, Lightning would sync lazily wherever the value is first read, which on rank 0 alone is the
        # progress bar, and a collective made by one rank crashes or hangs the others.
        self.log_dict({k: torch.as_tensor(v, dtype=torch.float32) for k, v in metrics.items()}, prog_bar=prog_bar,
                      on_step=False, on_epoch=True, batch_size=1)

    # --- evaluation ----------------------------------------------------------------------------------

    def _evaluate(self, batch, loss_metric):
        x, y = batch
        logits = self(x)
        loss_metric.update(F.cross_entropy(logits, y), weight=len(y))
        return logits, y

    def validation_step(self, batch, batch_idx):
        logits, y = self._evaluate(batch, self.val_loss)
        self.val_acc.update(logits, y)

    def on_validation_epoch_end(self):
        loss, acc = self.val_loss.compute(), self.val_acc.compute()
        self.val_loss.reset()
        self.val_acc.reset()
        metrics = {"val/loss": loss, "val/acc": acc}
        if not self.trainer.sanity_checking:  # the untrained model is no one's best epoch
            self.val_acc_best = torch.fmax(self.val_acc_best, acc.to(self.val_acc_best))
            metrics["val/acc_best"] = self.val_acc_best
        self._log(metrics, prog_bar=True)

    def test_step(self, batch, batch_idx):
        logits, y = self._evaluate(batch, self.test_loss)
        self.test_confusion.update(logits, y)

    def on_test_epoch_end(self):
        confusion = self.test_confusion.compute()
        loss = self.test_loss.compute()
        self.test_confusion.reset()
        self.test_loss.reset()
        correct, per_class_total = confusion.diag(), confusion.sum(1)
        per_class = correct / per_class_total.clamp(min=1)
        self._log({"test/loss": loss, "test/acc": correct.sum() / confusion.sum(), "test/samples": confusion.sum()})
        # A class without test images has no accuracy: logged as NaN, printed as "no test images".
        per_class = torch.where(per_class_total > 0, per_class, torch.nan)
        self._log({f"test/acc_class/{name}": acc for name, acc in zip(self.class_names, per_class)})
        self.test_per_class_acc = dict(zip(self.class_names, per_class.tolist()))
        self.test_confusion_matrix = confusion.cpu()  # rows: true class, columns: predicted

    def predict_step(self, batch, batch_idx):
        """Class probabilities for a batch of uint8 images (from files) or of normalised float images."""
        x = batch[0]
        if x.dtype == torch.uint8:
            x = self.normalize(x)
        return self(x).softmax(1)

    # --- optimisation ----------------------------------------------------------------------------------

    def configure_optimizers(self):
        return self.make_optimizer(self.total_optimizer_steps())

    def make_optimizer(self, total_steps: int) -> dict:
        """The configured optimizer and per-step schedule over `total_steps` optimizer steps."""
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        try:
            scheduler = self.scheduler_factory(optimizer, total_steps=total_steps)
        except TypeError as e:  # a schedule that plans its own length (StepLR, say)
            if "total_steps" not in str(e):
                raise
            scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def total_optimizer_steps(self) -> int:
        """Optimizer steps in the whole run, from the trainer's limits and the training batches an epoch.

        Not `trainer.estimated_stepping_batches`: that counts calls, which hold K steps each.
        """
        trainer = self.trainer
        trainer.estimated_stepping_batches  # noqa: B018 (sets up the training loader if it is not yet)
        loader = trainer.train_dataloader
        steps_per_epoch = getattr(loader, "num_steps", None)
        if steps_per_epoch is None:  # a loader of plain batches
            return int(trainer.estimated_stepping_batches)
        per_epoch = math.ceil(steps_per_epoch / self.accumulate_grad_batches)
        total = per_epoch * max(trainer.max_epochs, 1) if trainer.max_epochs not in (None, -1) else math.inf
        if trainer.max_steps >= 0:
            total = min(total, trainer.max_steps)
        if total == math.inf:
            raise ValueError("an LR schedule over the run needs --trainer.max_epochs or --trainer.max_steps")
        return max(int(total), 1)
