"""A learning-rate schedule that spans the whole run, sized by the trainer; a model's optimizer and
schedule as Lightning takes them."""

from typing import Optional

from torch.optim import Optimizer
from torch.optim.lr_scheduler import OneCycleLR

from lit_models.checks import ModelError
from lit_models.resume import Resumption


class OneCycle(OneCycleLR):
    """One cycle over the whole run, peaking at the optimizer's lr (`--model.scheduler OneCycle`).

    torch's OneCycleLR with `max_lr` taken from the optimizer, so that the optimizer's `lr` is
    the one learning rate to set, and `total_steps` from the trainer
    (`trainer.estimated_stepping_batches`, filled in by ImageClassifier): warm up from lr/25 for
    `warmup` of the steps, then anneal (cosine) to ~0 by the last step; with momentum optimizers,
    momentum cycles inversely (0.95 -> 0.85 -> 0.95) in place of the optimizer's own, unless
    `cycle_momentum` is false.

    Args:
        optimizer: the optimizer whose learning rate it drives.
        total_steps: the run's optimizer steps; None (in a config): the trainer's, filled in by the
            model.
        warmup: the fraction of the steps spent warming up, in (0, 1).
        cycle_momentum: cycle the momentum (or Adam's beta1) as above; false keeps the optimizer's.
    """

    def __init__(self, optimizer: Optimizer, total_steps: Optional[int] = None,
                 warmup: float = 0.25, cycle_momentum: bool = True):
        if total_steps is None:
            raise ModelError("OneCycle needs the run's number of optimizer steps (ImageClassifier "
                             "gives it)")
        if not 0 < warmup < 1:
            raise ModelError(f"--model.scheduler.warmup must be between 0 and 1, not {warmup}")
        # OneCycleLR divides by the length of each phase (warm-up steps - 1, and the rest): keep
        # both positive however short the run.
        pct_start = min(max(warmup, 1.5 / total_steps), 1 - 0.5 / total_steps)
        max_lr = [group["lr"] for group in optimizer.param_groups]
        super().__init__(optimizer, max_lr=max_lr, total_steps=total_steps, pct_start=pct_start,
                         cycle_momentum=cycle_momentum)


def configured(factory, optimizer: Optimizer, steps: int | None, resumed: Resumption | None):
    """The optimizer and the schedule `factory` builds for it, as configure_optimizers returns
    them: one that takes `total_steps` (OneCycle) planned over the run's `steps` (from a resumed
    fit's step, where the schedule starts anew) and stepped every step, any other every epoch;
    `resumed` is told which ran."""
    if factory is None:
        return optimizer
    if steps is None:
        scheduler = factory(optimizer)
        # LightningCLI's ReduceLROnPlateau names the metric it follows (`--lr_scheduler.monitor`).
        schedule = {"scheduler": scheduler, "monitor": getattr(scheduler, "monitor", None)}
    else:
        start = 0
        if resumed is not None and resumed.new_schedule:
            start = min(resumed.step, steps - 1)  # from the checkpoint's step to the end
        scheduler = factory(optimizer, total_steps=steps - start)
        schedule = {"scheduler": scheduler, "interval": "step"}
    if resumed is not None:
        resumed.schedule, resumed.end = type(scheduler).__name__, steps
    return {"optimizer": optimizer, "lr_scheduler": schedule}
