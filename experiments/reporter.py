"""The Lightning callback that connects a trial's training to its Optuna trial."""

import lightning as L


class TrialReporter(L.Callback):
    """Reports each epoch's val/acc to the Optuna trial and, when the pruner says the trial is hopeless,
    stops training at the end of that epoch (`pruned_epoch` then says which).

    Stopping the trainer, rather than raising optuna.TrialPruned (as optuna-integration's callback does),
    ends the run like any other: its best checkpoint is tested, and its run directory and results.json are
    written, so a pruned trial is in TensorBoard and the summary with what it reached.
    """

    def __init__(self, trial, prune: bool, params: dict):
        self.trial, self.prune = trial, prune
        self.pruned_epoch = None
        self.run_hparams = params  # the trial's options, for the HParams tab (lit_models/dashboards.py)

    def on_validation_end(self, trainer, pl_module):
        value = trainer.callback_metrics.get("val/acc")
        if trainer.sanity_checking or value is None or trainer.state.fn != "fit":
            return
        epoch = trainer.current_epoch
        self.trial.report(float(value), epoch)  # one host sync an epoch
        last = trainer.max_epochs is not None and epoch + 1 >= trainer.max_epochs
        if self.prune and not last and self.trial.should_prune():
            trainer.should_stop = True
            self.pruned_epoch = epoch
