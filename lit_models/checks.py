"""What the model refuses, and why: ModelError, and the checks of ImageClassifier's arguments, data,
batches, weights, checkpoints and callbacks that raise it (and the one state it mends instead).
Each is a function of what it checks, so that the model's hooks read as what they do."""

import math
import multiprocessing

import lightning as L
import torch
from lightning.pytorch.callbacks import BaseFinetuning, BatchSizeFinder, StochasticWeightAveraging
from torchmetrics import Metric


class ModelError(RuntimeError):
    """The model cannot be built, trained or used as asked; the message says why and what to do."""


def check_arguments(lr, label_smoothing: float, mixup: float, cutmix: float,
                    translate_test: int = 0) -> None:
    """A ModelError for a learning rate that is not a positive number, or a label smoothing, mixup,
    cutmix or test-time shift out of range."""
    if lr is not None and not positive_number(lr):
        raise ModelError(f"--model.lr {lr}: a learning rate is a positive number")
    if not (isinstance(translate_test, int) and translate_test >= 0):
        raise ModelError(f"--model.translate_test {translate_test}: a number of pixels, at least 0")
    if not 0 <= label_smoothing <= 1 or min(mixup, cutmix) < 0:
        raise ModelError(f"--model.label_smoothing {label_smoothing} must be in [0, 1], "
                         f"--model.mixup {mixup} and --model.cutmix {cutmix} at least 0")


def positive_number(value: float) -> bool:
    """Whether `value` is finite and above 0."""
    return math.isfinite(value) and value > 0


def check_normalisation(mean: list[float], std: list[float], image_shape) -> None:
    """A ModelError unless `mean` and `std` have one value per channel, and std > 0."""
    channels = image_shape[0]
    one_per_channel = len(mean) == channels and len(std) == channels
    if not one_per_channel or min(std) <= 0:
        raise ModelError(f"mean {mean} and std {std} need one value per channel of "
                         f"{tuple(image_shape)} images, and std > 0")


def check_data_given(data) -> None:
    """A ModelError for a model given neither its image shape, classes and statistics nor a data
    module `data` to take them from."""
    if data is None:
        raise ModelError("ImageClassifier needs image_shape, num_classes, mean and std, or a "
                         "data module")


def check_facts(data, missing: list[str]) -> None:
    """A ModelError naming what the data module `data` does not say about its images (`missing`),
    and the options that give it; class names may be missing (numbers serve as names)."""
    missing = [name for name in missing if name != "class_names"]
    if missing:
        options = " ".join(f"--model.{name} ..." for name in missing)
        raise ModelError(f"the data module {type(data).__name__} does not say the images' "
                         f"{', '.join(missing)}: give them to the model ({options})")


def check_data(model, data) -> None:
    """A ModelError if `data`'s images or classes are not the ones `model` (an ImageClassifier) was
    built for."""
    hp = model.hparams
    shape = getattr(data, "image_shape", None)
    classes = getattr(data, "classes", None)
    other_shape = shape is not None and tuple(shape) != tuple(hp.image_shape)
    if other_shape or other_classes(classes, model):
        raise ModelError(f"this model takes {tuple(hp.image_shape)} images of {hp.num_classes} "
                         f"classes ({', '.join(model.class_names[:3])}, ...); the data module "
                         f"{type(data).__name__} has {tuple(shape or ())} images of "
                         f"{len(classes or [])} classes ({', '.join((classes or [])[:3])}, ...)")


def other_classes(classes, model) -> bool:
    """Whether a data module's `classes` (None: it does not say) are not those of `model`."""
    return classes is not None and list(classes) != model.class_names


def check_can_build(trainer: L.Trainer, net) -> None:
    """A ModelError where configure_model cannot build the network now: without a data module, or
    in a fit that needed it before it starts."""
    check_data_given(trainer.datamodule)
    if net is None and trainer.state.fn == "fit":
        check_averaging(trainer.callbacks)
        check_started_here(trainer.strategy)


def check_averaging(callbacks: list) -> None:
    """A ModelError for StochasticWeightAveraging, which copies the model in its setup, before
    configure_model builds the network from the data."""
    if any(isinstance(c, StochasticWeightAveraging) for c in callbacks):
        raise ModelError("StochasticWeightAveraging copies the model before it is built from the "
                         "data: give the model its image_shape and num_classes, or call "
                         "model.take_from_data(data) before fitting (train.py does), or average "
                         "with EMA or WeightAveraging, which build it first")


def check_started_here(strategy) -> None:
    """A ModelError for a fit in processes Lightning started from the user's (ddp_spawn, ddp_fork,
    ddp_notebook) of a model whose network is built only there: Lightning loads the trained
    weights back into the user's model with strict=False, which drops those of a network it does
    not have, and a test after it would build an untrained one."""
    if strategy.launcher is not None and multiprocessing.parent_process() is not None:
        raise ModelError("this fit trains in processes started from yours (ddp_spawn, ddp_fork), "
                         "and Lightning gives the weights back only into a network the model "
                         "has: call model.take_from_data(data) before trainer.fit (or give the "
                         "model image_shape and num_classes), or use the strategy ddp")


# Callbacks that change what a schedule over the whole run was planned for, after it was planned.
PLAN_CHANGES = {BaseFinetuning: "adds the layers it thaws to the optimizer",
                BatchSizeFinder: "changes the batches"}


def check_planned_schedule(callbacks: list) -> None:
    """A ModelError for a callback that changes the steps or the trained layers after a schedule
    over the whole run (--model.scheduler OneCycle) planned them."""
    for callback in callbacks:
        for cls, change in PLAN_CHANGES.items():
            if isinstance(callback, cls):
                raise ModelError(f"{type(callback).__name__} {change} after the schedule "
                                 f"(--model.scheduler) planned the run's steps: give "
                                 f"--model.scheduler null, or an epoch schedule")


def check_bounded(steps: float) -> None:
    """A ModelError for a run of endless steps, which a schedule over the whole run cannot plan."""
    if steps == float("inf"):
        raise ModelError("a schedule over the whole run needs --trainer.max_epochs or "
                         "--trainer.max_steps")


def check_ready(net, mean) -> None:
    """A ModelError for a model without its network `net` or normalisation (`mean`) yet."""
    if net is None or mean is None:
        raise ModelError("the model has no network or normalisation yet: give it image_shape, "
                         "num_classes, mean and std, or fit it with a data module first (or "
                         "model.take_from_data(data))")


def check_batch(images: torch.Tensor) -> None:
    """A ModelError for a batch that is not uint8 images: floats may be normalised already, and
    would be normalised again (a dtype, not a value: no wait for the device)."""
    if images.is_floating_point():
        dtype = str(images.dtype).removeprefix("torch.")
        raise ModelError(f"ImageClassifier takes uint8 image batches (0..255) and normalises them "
                         f"itself; this batch is {dtype} (ToTensor/Normalize?): give it uint8 "
                         f"images (torchvision's transforms.v2.PILToTensor()), or a data module "
                         f"of datamodules/")


def check_sequential(net, net_name: str) -> None:
    """A ModelError unless `net` is an nn.Sequential, whose layers but the last are the backbone
    that BackboneFinetuning takes."""
    if not isinstance(net, torch.nn.Sequential):
        raise ModelError(f"BackboneFinetuning takes the layers but the last of an "
                         f"nn.Sequential network as its backbone; {net_name} is not one: "
                         f"give your model a `backbone`")


def check_finite(net: torch.nn.Module, epoch: int, step: int) -> None:
    """A ModelError if a weight of `net` (None: no network yet) is NaN or infinite: a diverged run
    stops before a checkpoint, an export or a test holds it."""
    if net is None:
        return
    # Not a collective: every process holds the same weights, and stops alike.
    if not torch.stack([p.isfinite().all() for p in net.parameters()]).all():
        raise ModelError(f"the weights became NaN or infinite in epoch {epoch} (by step {step}); "
                         f"no checkpoint holds them. Try a lower learning rate (--model.lr)")


def check_weights(model, weights: dict, strict: bool = True) -> None:
    """A ModelError naming the `weights` that are NaN or infinite, or of another shape than those of
    `model` (an ImageClassifier), or (`strict`) missing or unexpected."""
    ours = model.state_dict()
    shared = ours.keys() & weights.keys()
    wrong = []
    if strict:
        wrong = sorted(ours.keys() ^ weights.keys())
    wrong += [k for k in shared if ours[k].shape != weights[k].shape]
    damaged = [k for k, v in weights.items() if is_damaged(k, v)]
    if damaged:
        raise ModelError(f"the checkpoint holds NaN or infinite weights "
                         f"({', '.join(damaged[:4])}): it is damaged, or saved from a diverged "
                         f"run; use another")
    if wrong:
        hp = model.hparams
        raise ModelError(f"the checkpoint's weights do not fit this model ({model.net_name} for "
                         f"{hp.num_classes} classes of {tuple(hp.image_shape)} images): "
                         f"{', '.join(wrong[:4])} missing, unexpected or of another shape")


def is_damaged(name: str, value: torch.Tensor) -> bool:
    """Whether a weight of the network or a normalisation statistic is NaN or infinite."""
    # Not the metrics: without validation, val_acc_best is -inf.
    if not (name.startswith("net.") or name in ("mean", "std")):
        return False
    return value.is_floating_point() and not torch.isfinite(value).all()


def check_resumable(checkpoint: dict, data) -> None:
    """A ModelError for a checkpoint saved mid-epoch without the position of the data module
    `data` (which keeps one) in it."""
    if data is None or type(data).state_dict is L.LightningDataModule.state_dict:
        return  # no data module, or one without a position
    position_saved = bool(checkpoint.get(type(data).__qualname__))
    # Without the data module's position, the epoch would restart its batches from the first (a
    # checkpoint of an earlier version of this project): some would be trained twice, others never.
    if not position_saved and stopped_mid_epoch(checkpoint):
        raise ModelError(f"this checkpoint was saved in the middle of epoch "
                         f"{checkpoint.get('epoch')} without the position of {type(data).__name__} "
                         f"in it, so resuming could not train that epoch's batches exactly once: "
                         f"resume from a checkpoint saved at the end of an epoch, or start a "
                         f"new run")


def stopped_mid_epoch(checkpoint: dict) -> bool:
    """Whether a training checkpoint was saved after some of an epoch's batches, before the epoch's
    end."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs = fit.get("epoch_progress", {}).get("total", {})
    batches = fit.get("epoch_loop.batch_progress", {}).get("current", {})
    return epochs.get("processed", 0) < epochs.get("started", 0) and batches.get("completed", 0) > 0


def outside_inference_mode(model: L.LightningModule) -> None:
    """Normal copies of the metrics' states that a validation or test (Lightning runs them in
    torch's inference mode) left as inference tensors, which training may not update in place."""
    for metric in model.modules():
        if not isinstance(metric, Metric):
            continue
        for name, value in metric.metric_state.items():
            if isinstance(value, torch.Tensor) and value.is_inference():
                setattr(metric, name, value.clone())
