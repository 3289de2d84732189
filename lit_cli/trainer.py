"""The Trainer train.py runs: Lightning's, with what its use commands add.

LightningCLI makes a subcommand's options of the Trainer method of that name: `predict`'s
`--inputs` and `--output`, and `export` as a subcommand of its own (LightningCLI's
`subcommands()` and a Trainer method, as Lightning's docs and tests add one).
"""

from pathlib import Path
from typing import Literal

import lightning as L

from lit_cli.errors import UsageError
from lit_cli.runs import read_checkpoint
from lit_models import ImageClassifier
from lit_models import export as exports
from lit_models import predict as predict_files


class Trainer(L.Trainer):
    """Lightning's Trainer; `predict` writes a CSV file, and `export` writes a servable file."""

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
               ckpt_path: str | None = None,
               format: Literal["onnx", "torchscript", "pt2"] = "onnx", output: str | None = None,
               weights_only: bool | None = None) -> dict:
        """Export a checkpoint's model for serving, checked against it on test images.

        Args:
            ckpt_path: the checkpoint to export.
            format: onnx, torchscript or pt2.
            output: the file to write; none: a new file beside the checkpoint's run.
            weights_only: as Lightning's other subcommands take it (checkpoints of this project
                load with torch's weights_only=True in any case).
        """
        model.load_state_dict(read_checkpoint(Path(ckpt_path))["state_dict"])
        return exports.export(model, datamodule, format, output, Path(ckpt_path))
