"""How a fit goes on from its checkpoint when the options that plan its training changed: every
option given takes effect, and the records say what ran.

- Nothing changed (the optimizer, its settings, the schedule and the run's length): the
  optimizer and schedule are restored as saved, and the run ends as one never stopped.
- Anything else (the optimizer's settings, its `lr` among them, the schedule's settings, the
  length of a run whose schedule is planned over its steps: `--trainer.max_epochs` of a finished
  OneCycle run): the optimizer's state (Adam's moments, SGD's momentum) runs on with the
  settings given now, and a new schedule from the checkpoint's step to the run's end. OneCycle
  warms up again to `lr` and anneals to the new end; a schedule by epochs starts from its first.
- Another optimizer class: a new optimizer (the checkpoint's state cannot be its), and a new
  schedule.
"""

from dataclasses import dataclass

import torch


@dataclass
class Resumption:
    """What a resumed fit takes from its checkpoint.

    Args:
        step: the checkpoint's optimizer step, where a new schedule starts.
        saved_optimizer: the checkpoint's optimizer class (its import path).
        optimizer_state: the checkpoint's optimizer state, to run with the settings given now;
            None: restored as saved (nothing changed), or not at all (another class).
        new_optimizer: another optimizer class than the checkpoint's.
        new_schedule: the schedule starts again at `step` (and the optimizer is not restored as
            saved); false: the run goes on exactly as saved.
    """

    step: int
    saved_optimizer: str
    optimizer_state: dict | None = None
    new_optimizer: bool = False
    new_schedule: bool = False
    schedule: str | None = None  # the schedule that runs, and the step it ends at (planned
    end: int | None = None  # over the run's steps)

    def said(self) -> str:
        """What ran, in a few words, for the record and the log."""
        if not self.new_schedule:
            return "the optimizer and schedule as saved"
        optimizer = "the optimizer's state, with the settings given now"
        if self.new_optimizer:
            optimizer = f"a new optimizer (the checkpoint's was {self.saved_optimizer})"
        if self.schedule is None:
            return optimizer
        said = f"{optimizer}; a new {self.schedule} schedule from step {self.step}"
        if self.end is None:  # a schedule by epochs
            return said
        return f"{said} to {self.end}"


def plan(checkpoint: dict, hparams, run_steps: int | None) -> Resumption:
    """How a fit with the hyperparameters `hparams` goes on from `checkpoint` (whose schedule, if
    planned over the run's steps, the run's `run_steps` replan), and the checkpoint's optimizer
    and schedule states taken out of it where they must not be restored as saved."""
    saved = checkpoint.get("hyper_parameters") or {}
    optimizer, was = settings(hparams), settings(saved)
    same_class = optimizer["class_path"] == was["class_path"]
    same_settings = same_class and optimizer == was
    same_length = run_steps is None or planned_end(checkpoint) in (None, run_steps)
    same_schedule = hparams.get("scheduler") == saved.get("scheduler") and same_length
    exact = same_settings and same_schedule
    resumed = Resumption(step=int(checkpoint.get("global_step", 0)),
                         saved_optimizer=str(was["class_path"]), new_optimizer=not same_class,
                         new_schedule=not exact)
    states = checkpoint.get("optimizer_states") or []
    if not exact:  # Lightning restores what the lists hold: nothing
        if same_class and states:
            resumed.optimizer_state = states[0]
        checkpoint["optimizer_states"], checkpoint["lr_schedulers"] = [], []
    return resumed


def settings(hparams) -> dict:
    """The optimizer of `hparams`, as `{class_path, init_args}`."""
    spec = hparams.get("optimizer")
    if not isinstance(spec, dict):
        return {"class_path": str(spec), "init_args": {}}
    return {"class_path": spec.get("class_path"), "init_args": dict(spec.get("init_args") or {})}


def planned_end(checkpoint: dict) -> int | None:
    """The optimizer step where the checkpoint's schedule ends, if planned over steps
    (OneCycle)."""
    schedules = checkpoint.get("lr_schedulers") or [{}]
    total, taken = schedules[0].get("total_steps"), schedules[0].get("last_epoch")
    if total is None or taken is None:
        return None
    return int(checkpoint.get("global_step", 0)) - taken + total


def load_state(optimizer: torch.optim.Optimizer, resumed: Resumption | None) -> None:
    """The checkpoint's optimizer state (per parameter) in `optimizer`, whose settings stay, where
    the plan runs it with the settings given now."""
    if resumed is None or resumed.optimizer_state is None:
        return
    merged = optimizer.state_dict()
    merged["state"] = resumed.optimizer_state["state"]
    optimizer.load_state_dict(merged)
