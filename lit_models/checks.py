"""What the model refuses, and why: ModelError, and the checks of ImageClassifier's arguments, data,
weights and callbacks that raise it. Each is a function of what it checks, so that the model's
hooks read as what they do."""

import multiprocessing

import lightning as L
import torch
from lightning.pytorch.callbacks import BaseFinetuning, BatchSizeFinder, StochasticWeightAveraging
from torchmetrics import Metric


class ModelError(RuntimeError):
    """The model cannot be built, trained or used as asked; the message says why and what to do."""


def check_arguments(label_smoothing: float, mixup: float, cutmix: float,
                    translate_test: int) -> None:
    """A ModelError for a label smoothing, mixup, cutmix or test-time shift out of range."""
    shift_ok = isinstance(translate_test, int) and translate_test >= 0
    if not (0 <= label_smoothing <= 1 and min(mixup, cutmix) >= 0 and shift_ok):
        raise ModelError(f"--model.label_smoothing {label_smoothing} must be in [0, 1], "
                         f"--model.mixup {mixup}, --model.cutmix {cutmix} and "
                         f"--model.translate_test {translate_test} at least 0")


def check_normalisation(mean: list[float], std: list[float], image_shape) -> None:
    """A ModelError unless `mean` and `std` have one value per channel, and std > 0."""
    one_per_channel = len(mean) == len(std) == image_shape[0]
    if not one_per_channel or min(std) <= 0:
        raise ModelError(f"mean {mean} and std {std} need one value per channel of "
                         f"{tuple(image_shape)} images, and std > 0")


def check_facts(data, hparams) -> None:
    """A ModelError naming, in one line, all that the data module `data` does not say about its
    images and the model was not given, with the options that give it."""
    missing = [name for name in ("image_shape", "num_classes") if hparams[name] is None]
    if missing:
        options = " ".join(f"--model.{name} ..." for name in missing)
        raise ModelError(f"the data module {type(data).__name__} does not say the images' "
                         f"{' and '.join(missing)}: give them to the model ({options})")


def check_data(model, data) -> None:
    """A ModelError if `data`'s images or classes are not the ones `model` (an ImageClassifier) was
    built for."""
    hp = model.hparams
    shape = getattr(data, "image_shape", None)
    classes = getattr(data, "classes", None)
    other_shape = shape is not None and tuple(shape) != tuple(hp.image_shape)
    named = list(hp.class_names or classes or [])  # no names given: as many classes
    other_classes = classes is not None and (list(classes) != named or len(named) != hp.num_classes)
    if other_shape or other_classes:
        raise ModelError(f"this model takes {tuple(hp.image_shape)} images of {hp.num_classes} "
                         f"classes ({', '.join(model.class_names[:3])}, ...); the data module "
                         f"{type(data).__name__} has {tuple(shape or ())} images of "
                         f"{len(classes or [])} classes ({', '.join((classes or [])[:3])}, ...)")


def check_can_build(trainer: L.Trainer, net) -> None:
    """A ModelError where configure_model cannot build the network now: in a fit that needed it
    before it started. StochasticWeightAveraging copies the model in its setup, and Lightning
    loads the weights of a fit in processes it started from the user's (ddp_spawn, ddp_fork) back
    with strict=False, which drops those of a network the model does not have."""
    if net is not None or trainer.state.fn != "fit":
        return
    averaging = any(isinstance(c, StochasticWeightAveraging) for c in trainer.callbacks)
    started_here = trainer.strategy.launcher is not None and multiprocessing.parent_process()
    if averaging or started_here:
        raise ModelError("the model is built from the data only as the fit starts, and "
                         "StochasticWeightAveraging (or processes started from yours: "
                         "ddp_spawn) needs it before: call model.take_from_data(data) before "
                         "fitting (train.py does), or give the model image_shape and num_classes")


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


def check_ready(net) -> None:
    """A ModelError for a model without its network `net` yet."""
    if net is None:
        raise ModelError("the model has no network yet: give it image_shape and num_classes, or "
                         "fit it with a data module first (or model.take_from_data(data))")


def check_finite(net: torch.nn.Module, epoch: int, step: int) -> None:
    """A ModelError if a weight of `net` (None: no network yet) is NaN or infinite: a diverged run
    stops before a checkpoint, an export or a test holds it."""
    if net is None:
        return
    # Not a collective: every process holds the same weights, and stops alike.
    if not torch.stack([p.isfinite().all() for p in net.parameters()]).all():
        raise ModelError(f"the weights became NaN or infinite in epoch {epoch} (by step {step}); "
                         f"no checkpoint holds them. Try a lower learning rate "
                         f"(--model.optimizer.lr)")


def check_weights(model, weights: dict, strict: bool = False) -> None:
    """A ModelError naming the `weights` that are NaN or infinite, or of another shape than those of
    `model` (an ImageClassifier), or (`strict`) missing or unexpected."""
    ours = model.state_dict()
    wrong = sorted(ours.keys() ^ weights.keys()) if strict else []
    wrong += [k for k in ours.keys() & weights.keys() if ours[k].shape != weights[k].shape]
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


def outside_inference_mode(model: L.LightningModule) -> None:
    """Normal copies of the metrics' states that a validation or test (Lightning runs them in
    torch's inference mode) left as inference tensors, which training may not update in place."""
    for metric in [m for m in model.modules() if isinstance(m, Metric)]:
        for name, value in metric.metric_state.items():
            if isinstance(value, torch.Tensor) and value.is_inference():
                setattr(metric, name, value.clone())
