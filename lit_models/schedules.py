"""Learning-rate schedules that span a whole run; the model calls them with the run's optimizer steps.

`ImageClassifier` calls its scheduler as `scheduler(optimizer, total_steps=N)`, N being the optimizer steps
of the whole run, so that a schedule is planned from the trainer's settings (epochs, batches, accumulation)
instead of being configured twice. Schedules that take no `total_steps` (torch's StepLR, say) are called
with the optimizer alone.
"""

from typing import Optional

from torch.optim import Optimizer
from torch.optim.lr_scheduler import OneCycleLR


class ScheduleMismatchError(ValueError):
    """A checkpoint's schedule was planned for another run length than the run resuming it."""


class OneCycle(OneCycleLR):
    """One cycle over the whole run, peaking at the optimizer's lr (`--model.scheduler OneCycle`).

    torch's OneCycleLR with `max_lr` taken from the optimizer (so that `--model.optimizer.lr` is the
    one learning rate to set): warm up from lr/25 for `warmup` of the steps, then anneal (cosine) to
    ~0 by the last step; with momentum optimizers, momentum cycles inversely (0.95 -> 0.85 -> 0.95).

    Args:
        optimizer: the optimizer whose learning rate it drives.
        total_steps: the run's optimizer steps; None (the default) in a config means "the run's
            length", which the model fills in.
        warmup: the fraction of the steps spent warming up, in (0, 1).
    """

    def __init__(self, optimizer: Optimizer, total_steps: Optional[int] = None, warmup: float = 0.25):
        if not 0 < warmup < 1:
            raise ValueError(f"warmup must be a fraction of the steps between 0 and 1, got {warmup}")
        if total_steps is None or total_steps < 1:
            raise ValueError(f"OneCycle needs the run's number of optimizer steps (>= 1), got {total_steps}")
        # OneCycleLR divides by the length of each phase, counted as (warmup steps - 1) and the steps after
        # it: keep both positive however short the run (4 CNN batches at warmup 0.25 made the first 0).
        pct_start = min(max(warmup, 1.5 / total_steps), 1 - 0.5 / total_steps)
        super().__init__(optimizer, max_lr=[group["lr"] for group in optimizer.param_groups],
                         total_steps=total_steps, pct_start=pct_start)

    def load_state_dict(self, state_dict: dict) -> None:
        planned, resuming = state_dict.get("total_steps"), self.total_steps
        if planned != resuming:
            raise ScheduleMismatchError(
                f"the checkpoint's OneCycle schedule was planned for {planned} optimizer steps and has annealed "
                f"the learning rate by its end; this run would take {resuming}. A OneCycle run cannot be "
                f"extended or shortened: resume it with the --trainer.max_epochs/--trainer.max_steps it was "
                f"started with, or start a new run")
        super().load_state_dict(state_dict)
