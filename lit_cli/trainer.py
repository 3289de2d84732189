"""The Trainer train.py runs: Lightning's, with what its use commands add.

LightningCLI makes a subcommand's options of the Trainer method of that name: `predict`'s
`--inputs` and `--output`, and `export` as a subcommand of its own (LightningCLI's
`subcommands()` and a Trainer method, as Lightning's docs and tests add one).
"""

from pathlib import Path
from typing import Literal, Optional, Union

import lightning as L

from lit_cli.runs import read_checkpoint
from lit_models import export as exports
from lit_models import predict as predict_files


class Trainer(L.Trainer):
    """Lightning's Trainer; `predict` writes a CSV file, and `export` writes a servable file."""

    def predict(self, model=None, dataloaders=None, datamodule=None, return_predictions=None,
                ckpt_path=None, weights_only=None, inputs: Union[str, list[str], None] = None,
                output: Optional[str] = None) -> dict:
        """Predict into a file: an ImageClassifier's top classes of each image into a CSV file;
        a LightningModule of the user's through the prediction writers among its callbacks, or
        else its predictions into a file torch.load reads.

        Args:
            inputs: an image file, folder (searched recursively) or glob, or a list of them; none:
                the test split of the checkpoint's data set, with its true labels.
            output: the file to write; none: a new file beside the checkpoint's run.
        """
        return predict_files.predict(self, model, dataloaders or datamodule, ckpt_path, inputs,
                                     output, weights_only)

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
        checkpoint = read_checkpoint(Path(ckpt_path))
        model.on_load_checkpoint(checkpoint)  # as Lightning loads one: the model's checks first
        model.load_state_dict(checkpoint["state_dict"])
        return exports.export(model, datamodule, format, output, Path(ckpt_path))
