"""The Trainer train.py runs: Lightning's, with what its use commands add, and the strategies it
cannot run.

LightningCLI makes a subcommand's options of the Trainer method of that name: `predict`'s
`--inputs` and `--output`, and `export` as a subcommand of its own (LightningCLI's
`subcommands()` and a Trainer method, as Lightning's docs and tests add one).
"""

from pathlib import Path

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities.model_helpers import is_overridden

from datamodules import DATA, ImageDataModule
from lit_cli.errors import UsageError
from lit_cli.runs import read_checkpoint
from lit_models import ImageClassifier
from lit_models import export as exports
from lit_models import predict as predict_files


class Trainer(L.Trainer):
    """Lightning's Trainer; `predict` writes a CSV file, and `export` writes a servable file."""

    wrote = None  # the record, predictions or export written whole, for the line of a stop

    def predict(self, model=None, dataloaders=None, datamodule=None, return_predictions=None,
                ckpt_path=None, weights_only=None, inputs: list[str] | None = None,
                output: str | None = None) -> dict:
        """Predict each image's top classes into a CSV file (an ImageClassifier's; a user's
        LightningModule predicts as in Lightning, through the prediction writers among the
        callbacks).

        Args:
            inputs: image files, folders (searched recursively) or globs; none: the test split of
                the checkpoint's data set, with its true labels.
            output: the CSV file; none: a new file beside the checkpoint's run.
        """
        if dataloaders is not None:
            raise UsageError("train.py's predict reads --inputs or the data module's test split")
        if isinstance(model, ImageClassifier):
            return predict_files.predict(self, model, datamodule, ckpt_path, inputs, output,
                                         weights_only)
        if inputs or output:  # a user's LightningModule: Lightning's predict, as LightningCLI's
            raise UsageError(f"--inputs and --output write an ImageClassifier's predictions; "
                             f"{type(model).__name__}'s go to the prediction writers among "
                             f"--trainer.callbacks")
        return super().predict(model, datamodule=datamodule, ckpt_path=ckpt_path,
                               weights_only=weights_only, return_predictions=return_predictions)

    def export(self, model: L.LightningModule, datamodule: L.LightningDataModule | None = None,
               ckpt_path: str | None = None, format: str = "onnx", output: str | None = None,
               weights_only: bool | None = None) -> dict:
        """Export a checkpoint's model for serving, checked against it on test images.

        Args:
            ckpt_path: the checkpoint to export.
            format: onnx, torchscript or pt2.
            output: the file to write; none: a new file beside the checkpoint's run.
            weights_only: as Lightning's other subcommands take it (checkpoints of this project
                load with torch's weights_only=True in any case).
        """
        if format not in exports.FORMATS:
            raise UsageError(f"--format {format}: choose one of {', '.join(exports.FORMATS)}")
        if ckpt_path is None:
            raise UsageError("export needs --ckpt_path: a checkpoint file, a run folder, or "
                             "best/last")
        model.load_state_dict(read_checkpoint(Path(ckpt_path))["state_dict"])
        exported = exports.export(model, datamodule, format, output, Path(ckpt_path))
        self.wrote = exported["output"]
        return exported


# Strategies whose processes are started by this one's (Lightning's ddp_spawn, ddp_fork,
# ddp_notebook), where `popen`, Lightning's ddp, runs the command again for each.
STARTED_HERE = ("spawn", "fork", "forkserver")


def check_strategy(strategy: str | Namespace) -> None:
    """A UsageError for a strategy that runs the command in processes this one starts: they give
    back the weights and the logged metrics only (Lightning's docs), and train.py tests and
    records a fit, and claims its run, in the process that ran it."""
    if isinstance(strategy, Namespace):
        start_method = (strategy.get("init_args") or Namespace()).get("start_method")
        named = f"{strategy.class_path} --trainer.strategy.start_method {start_method}"
    else:
        start_method = dict.get(StrategyRegistry, strategy, {}).get("init_params", {}).get(
            "start_method")
        named = strategy
    if start_method in STARTED_HERE:
        raise UsageError(f"--trainer.strategy {named}: its processes start from this one and "
                         f"give back only the weights and metrics, where train.py records and "
                         f"tests a run in the process that trained it; give ddp (for a script, "
                         f"Lightning's choice)")


def check_command(cli) -> None:
    """A UsageError for a command that cannot run as given: a model without data, a strategy whose
    processes start from this one (check_strategy), a use command in several processes, and
    `use_distributed_sampler false` where the data shards itself."""
    trainer, given, several = cli.trainer, cli.given.trainer, cli.trainer.world_size > 1
    if cli.datamodule is None and not is_overridden("train_dataloader", cli.model):
        raise UsageError(f"{type(cli.model).__name__} has no data: give --data NAME "
                         f"({', '.join(DATA)}) or the class path of a LightningDataModule")
    check_strategy(given.strategy)
    if cli.subcommand not in (None, "fit") and several:
        raise UsageError(f"{cli.subcommand} runs in one process: leave out "
                         f"--trainer.devices/num_nodes/strategy")
    shards_itself = isinstance(cli.datamodule, ImageDataModule) and trainer.world_size > 1
    if shards_itself and given.use_distributed_sampler is False:
        raise UsageError("--trainer.use_distributed_sampler false: the data modules share "
                         "their batches among the processes themselves, as Lightning's "
                         "DistributedSampler would; leave it true")
