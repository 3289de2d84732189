"""`train.py predict`: each image's top classes to a CSV file, for the test split (with its true
labels) or for image files, read with the decoder training used (README.md, Use)."""

import csv
import glob
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.exceptions import SIGTERMException

from datamodules.files import output_file, written_whole
from datamodules.images import ImageFiles, is_image, list_images, some, to_uint8_batch
from lit_models.checks import ModelError

SHOWN = 8  # predictions printed, spread over the images (a split is often sorted by class)


def classify(model, images) -> torch.Tensor:
    """ImageClassifier.classify: the class probabilities of uint8 images, PIL images or a list of
    them, decoded and resized as the image-folder data module does, in eval mode."""
    was_training = model.training
    model.eval()
    try:
        batch = to_uint8_batch(images, tuple(model.hparams.image_shape))
        with torch.no_grad():
            return model(batch.to(model.device)).softmax(1)
    finally:
        model.train(was_training)


def find_images(inputs: list[str]) -> list[Path]:
    """The image files --inputs names: files as given, folders searched recursively and globs (by
    extension: the files that are not images Pillow reads are named in one line, and skipped)."""
    found, skipped = [], []
    for spec in inputs:
        path = Path(spec).expanduser()
        if path.is_file():
            matches, others = [path], []
        elif path.is_dir():  # as an image folder's class folders are read: links followed, once
            (matches,), others = list_images([path])
        else:
            files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)
                           if Path(p).is_file())
            matches = [f for f in files if is_image(f.name)]
            others = [f for f in files if not is_image(f.name)]
        if not matches:
            there = "no such file, or no image files that Pillow reads there"
            if others:
                there = f"no image files that Pillow reads there, only {some(others)}"
            raise ModelError(f"--inputs {spec}: {there}")
        found += matches
        skipped += others
    if skipped:
        print(f"train.py: skipped {len(skipped)} files that are not images Pillow reads (by "
              f"their extension): {some(skipped)}", file=sys.stderr)
    return found


class CSVPredictions(BasePredictionWriter):
    """One CSV row per image as Lightning's predict loop produces each batch: its name, the top
    classes with their probabilities, and the true label of a split's image. A file that could
    not be read is named and skipped.

    Args:
        file: the open CSV file.
        class_names: the model's classes.
        files: the image files predicted, in order; none: a data module's test split.
        top_k: how many classes each row ranks.
    """

    def __init__(self, file, class_names: list[str], files: list[Path] | None, top_k: int = 3):
        super().__init__(write_interval="batch")
        self.class_names, self.files = class_names, [str(f) for f in files or []]
        self.labelled = files is None  # a split's batches are (images, labels)
        self.top_k = min(top_k, len(class_names))
        self.csv = csv.writer(file)
        self.seen, self.rows, self.correct, self.failures = 0, [], 0, []
        ranks = [f"top{k}{part}" for k in range(2, self.top_k + 1) for part in ("", "_probability")]
        self.csv.writerow(["path", "label", "probability", *ranks] + ["true_label"] * self.labelled)

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx=0):
        top = prediction.float().topk(self.top_k, dim=1)
        probabilities, classes = top.values.cpu().tolist(), top.indices.cpu().tolist()
        for i, (p, c) in enumerate(zip(probabilities, classes)):
            ranked = [(self.class_names[c[k]], f"{p[k]:.6f}") for k in range(self.top_k)]
            n = self.seen + i
            name = self.files[n] if self.files else f"{trainer.datamodule.name or 'test'}:test:{n}"
            row = [name, *sum(ranked, ())]
            if self.labelled:
                truth = int(batch[1][i])
                row.append(self.class_names[truth])
                self.correct += c[0] == truth
            elif i in batch[1]:  # a batch of files: (images, {index: why it was unreadable})
                self.failures.append(row[0])
                print(f"train.py: skipped {row[0]}: cannot read it ({batch[1][i]})",
                      file=sys.stderr)
                continue
            self.csv.writerow(row)
            self.rows.append(row)
        self.seen += len(probabilities)
        if trainer.received_sigterm:  # Lightning's predict loop runs on through SIGTERM
            raise SIGTERMException


def predict(trainer: L.Trainer, model, data, ckpt_path, inputs: str | list[str] | None,
            output: str | None, weights_only: bool | None = None) -> dict:
    """Lightning's predict of `data` (a data module's test split, or loaders), or of the image
    files `inputs` names, into `output` (default: a new file beside the checkpoint's run): an
    ImageClassifier's through CSVPredictions, another module's through its own prediction
    writers, or else into a file of its predictions (`own_predictions`)."""
    from lit_models.classifier import ImageClassifier  # which imports this module

    if not isinstance(model, ImageClassifier):
        return own_predictions(trainer, model, data, ckpt_path, inputs, output, weights_only)
    paths, loader = None, None
    if inputs:  # Lightning predicts these files' loader, not the data module's split
        paths = find_images([inputs] if isinstance(inputs, str) else inputs)
        channels, height, width = model.hparams.image_shape
        loader, data = ImageFiles(paths, channels, (height, width)).loader(), None
    with (output_file(output, [ckpt_path, *(paths or [])], *beside(ckpt_path), ".csv") as target,
          written_whole(target) as tmp, open(tmp, "w", newline="", encoding="utf-8") as file):
        writer = CSVPredictions(file, model.class_names, paths)
        trainer.callbacks.append(writer)
        start = time.perf_counter()
        L.Trainer.predict(trainer, model, loader or data, return_predictions=False,
                          ckpt_path=ckpt_path, weights_only=weights_only)
        seconds = time.perf_counter() - start
        if not writer.rows:
            raise ModelError(f"none of the {writer.seen} images could be read; nothing written")
    return report(writer, target, seconds, trainer.strategy.root_device)


def own_predictions(trainer: L.Trainer, model, data, ckpt_path, inputs, output,
                    weights_only) -> dict:
    """A LightningModule of the user's predicts as Lightning runs it; without a prediction writer
    among its callbacks, what predict_step returned goes to a file (torch.load reads it)."""
    if inputs:
        raise ModelError(f"--inputs reads image files for an ImageClassifier; "
                         f"{type(model).__name__} predicts its data module's predict split")
    writers = [c for c in trainer.callbacks if isinstance(c, BasePredictionWriter)]
    predictions = L.Trainer.predict(trainer, model, data, return_predictions=not writers,
                                    ckpt_path=ckpt_path, weights_only=weights_only)
    if writers:
        return {"stage": "predict", "output": None}
    claimed = output_file(output, [ckpt_path], *beside(ckpt_path), ".pt")
    with claimed as target, written_whole(target) as tmp:
        torch.save(predictions, tmp)
    print(f"Predicted {len(predictions)} batches with {type(model).__name__}; wrote {target} "
          f"(torch.load(path): a list of what predict_step returned, a batch each)")
    return {"stage": "predict", "output": str(target)}


def beside(ckpt_path) -> tuple[Path, str]:
    """Where a prediction is written by default: a new predictions-DATE-TIME file beside the
    checkpoint's run (a name of its own: runs started in one second each get one)."""
    return Path(ckpt_path).parent.parent, f"predictions-{datetime.now():%Y%m%d-%H%M%S}"


def report(writer: CSVPredictions, target: Path, seconds: float, device) -> dict:
    """A few of the predictions, spread over the images (each once): a split's true and predicted
    classes in two lines, as the tutorial prints them, or files with their top classes; then the
    prediction's last line, and its record."""
    rows, count = writer.rows, min(SHOWN, len(writer.rows))
    shown = [rows[i * len(rows) // count] for i in range(count)]
    width = max(len(name) for name in writer.class_names)
    accuracy, said = None, ""
    if writer.labelled:
        accuracy = writer.correct / len(rows)
        said = f"; accuracy {accuracy:.4f}"
        print("GroundTruth:  " + " ".join(f"{row[-1]:{width}s}" for row in shown).rstrip())
        print("Predicted:    " + " ".join(f"{row[1]:{width}s}" for row in shown).rstrip())
    for row in [] if writer.labelled else shown:
        others = "".join(f"; {row[i]} {float(row[i + 1]):.3f}" for i in range(3, len(row) - 1, 2))
        print(f"{row[0]}  {row[1]} ({float(row[2]):.3f}){others}")
    if writer.failures:
        said += f"; {len(writer.failures)} unreadable skipped"
    print(f"Predicted {len(rows):,} images in {seconds:.2f} s ({writer.seen / seconds:,.0f} "
          f"images/s) on {device}{said}; wrote {target}")
    return {"stage": "predict", "output": str(target), "images": len(rows),
            "accuracy": accuracy, "unreadable": writer.failures, "seconds": seconds}
