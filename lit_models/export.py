"""Using a trained model: `train.py predict` (files or a test split, to a CSV file) and `train.py export` (a file a
serving stack loads without this project), both checked against the checkpoint they come from (README.md).
"""

import copy
import csv
import glob
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from datamodules.files import written_whole
from datamodules.images import IMG_EXTENSIONS, ImageFiles, list_images
from lit_models.classifier import ImageClassifier, ModelError

FORMATS = {"onnx": ".onnx", "torchscript": ".pt", "pt2": ".pt2"}
SHOWN = 8  # predictions printed, spread over the images (a folder or a split is often sorted by class)


def new_file(folder: Path, stem: str, suffix: str) -> Path:
    """folder/stem.suffix, or stem-1.suffix, stem-2.suffix, ...: the first that does not exist."""
    path, k = folder / f"{stem}{suffix}", 1
    while path.exists():
        path, k = folder / f"{stem}-{k}{suffix}", k + 1
    return path


def find_images(inputs: list[str]) -> list[Path]:
    """The image files --inputs names: files as given, folders searched recursively (by extension), globs."""
    found = []
    for spec in inputs:
        path = Path(spec).expanduser()
        if path.is_file():
            matches = [path]
        elif path.is_dir():
            matches = list_images([path])[0]  # as an image folder's class folders are read: links followed, once
        else:
            matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)
                             if p.lower().endswith(IMG_EXTENSIONS) and Path(p).is_file())
        if not matches:
            raise ModelError(f"--inputs {spec}: no such file, or no image files ({' '.join(IMG_EXTENSIONS)}) there")
        found += matches
    return found


class CSVPredictions(BasePredictionWriter):
    """One CSV row per image as Lightning's predict loop produces each batch: its name, the top classes with their
    probabilities, and the true label when the batch has one. A file that could not be read is named and skipped."""

    def __init__(self, file, class_names: list[str], names: list[str] | None, top_k: int = 3):
        super().__init__(write_interval="batch")
        self.class_names, self.names, self.top_k = class_names, names, min(top_k, len(class_names))
        self.csv = csv.writer(file)
        self.seen, self.rows, self.correct, self.failures = 0, [], 0, []
        header = ["path", "label", "probability"] + [f"top{k}{s}" for k in range(2, self.top_k + 1)
                                                     for s in ("", "_probability")]
        self.csv.writerow(header + ([] if names else ["true_label"]))

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        probabilities, classes = (t.cpu().tolist() for t in prediction.float().topk(self.top_k, dim=1))
        truths = None if self.names else batch[1].tolist()
        for i, (p, c) in enumerate(zip(probabilities, classes)):
            n = self.seen + i
            name = self.names[n] if self.names else f"{trainer.datamodule.name or 'test'}:test:{n}"
            if self.names and i in batch[1]:
                self.failures.append(name)
                print(f"train.py: skipped {name}: cannot read it ({batch[1][i]})", file=sys.stderr)
                continue
            row = [name] + [x for k in range(self.top_k) for x in (self.class_names[c[k]], f"{p[k]:.6f}")]
            if truths is not None:
                row.append(self.class_names[truths[i]])
                self.correct += c[0] == truths[i]
            self.csv.writerow(row)
            self.rows.append(row)
        self.seen += len(probabilities)
        if trainer.received_sigterm:  # Lightning's predict loop runs on through SIGTERM; its other loops stop
            raise SIGTERMException


def predict(trainer: L.Trainer, model: ImageClassifier, data, checkpoint: Path, inputs: list[str] | None,
            output: str | None) -> dict:
    """`train.py predict`: every image's top classes to a CSV file; a few of them and the accuracy printed."""
    paths = find_images(inputs) if inputs else None
    channels, height, width = model.hparams.image_shape
    loader = ImageFiles(paths, channels, (height, width)).loader() if paths else None
    target = Path(output).expanduser() if output else \
        new_file(checkpoint.parent.parent, f"predictions-{datetime.now():%Y%m%d-%H%M%S}", ".csv")
    with written_whole(target) as tmp, open(tmp, "w", newline="", encoding="utf-8") as file:
        writer = CSVPredictions(file, model.class_names, [str(p) for p in paths] if paths else None)
        trainer.callbacks.append(writer)
        start = time.perf_counter()
        trainer.predict(model, dataloaders=loader, datamodule=None if loader else data, return_predictions=False)
        seconds = time.perf_counter() - start
        if not writer.rows:
            raise ModelError(f"none of the {writer.seen} images could be read; nothing written")
    shown = [writer.rows[i * len(writer.rows) // SHOWN] for i in range(min(SHOWN, len(writer.rows)))]
    if paths:
        for row in shown:
            print(f"{row[0]}  {row[1]} ({float(row[2]):.3f})" +
                  "".join(f"; {row[i]} {float(row[i + 1]):.3f}" for i in range(3, len(row) - 1, 2)))
    else:
        width = max(len(name) for name in model.class_names)
        print("GroundTruth:  " + " ".join(f"{row[-1]:{width}s}" for row in shown).rstrip())
        print("Predicted:    " + " ".join(f"{row[1]:{width}s}" for row in shown).rstrip())
    accuracy = None if paths else writer.correct / len(writer.rows)
    print(f"Predicted {len(writer.rows):,} images in {seconds:.2f} s ({writer.seen / seconds:,.0f} images/s) on "
          f"{trainer.strategy.root_device}" + ("" if paths else f"; accuracy {accuracy:.4f}") +
          (f"; {len(writer.failures)} unreadable skipped" if writer.failures else "") + f"; wrote {target}")
    return {"stage": "predict", "output": str(target), "images": len(writer.rows), "accuracy": accuracy,
            "unreadable": writer.failures, "seconds": seconds}


class Servable(nn.Module):
    """The model as a server runs it: uint8 images (N, C, H, W) in, class probabilities out."""

    def __init__(self, model: ImageClassifier):
        super().__init__()
        self.register_buffer("mean", model.mean.float().clone())
        self.register_buffer("std", model.std.float().clone())
        # NCHW and float32: channels_last pays off in training kernels, exporters handle the standard layout best.
        self.net = copy.deepcopy(model.net).to(memory_format=torch.contiguous_format).float().eval()
        self.flip = bool(model.hparams.flip_test)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.float() / 255 - self.mean) / self.std
        logits = (self.net(x) + self.net(x.flip(3))) / 2 if self.flip else self.net(x)
        return logits.softmax(1)


def export(model: ImageClassifier, data, fmt: str = "onnx", output: str | None = None,
           checkpoint: Path | None = None) -> dict:
    """`train.py export`: write the model as `fmt` (onnx, torchscript, pt2) to `output` (default: beside the
    checkpoint's run), load the file as a server would, and check it against the model on up to 256 test images of
    `data` (in batches of 1 and of the rest: any N must work) before it takes its name."""
    if output is None and checkpoint is None:
        raise ModelError("export needs an output file or the checkpoint to name it after")
    target = Path(output).expanduser() if output else new_file(checkpoint.parent.parent, checkpoint.stem, FORMATS[fmt])
    data.setup("test")
    images = (test := data.test_dataloader()).images.index_select(0, test.indices[:256]).cpu()  # DiskImages too
    model = model.cpu().eval()
    expected = model.classify(images).numpy()
    servable = Servable(model).eval()
    hp = model.hparams
    meta = {"classes": json.dumps(model.class_names), "image_shape": json.dumps(list(hp.image_shape)),
            "input": "uint8 images (N, C, H, W), 0..255", "output": "class probabilities (N, classes)"}
    batch = torch.export.Dim("batch")
    with written_whole(target, FORMATS[fmt]) as tmp:  # torch.export.load insists on the .pt2 extension
        if fmt == "onnx":
            import onnx
            import onnxruntime

            torch.onnx.export(servable, (images[:2],), str(tmp), input_names=["images"], output_names=["probabilities"],
                              dynamic_shapes=({0: batch},), dynamo=True, external_data=False, verbose=False)
            graph = onnx.load(str(tmp))
            for key, value in meta.items():
                graph.metadata_props.add(key=key, value=value)
            onnx.save(graph, str(tmp))
            session = onnxruntime.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
            run, runtime = (lambda x: session.run(None, {"images": x})[0]), f"onnxruntime {onnxruntime.__version__}"
        else:
            if fmt == "torchscript":
                torch.jit.save(torch.jit.script(servable), str(tmp), _extra_files={"classes.json": meta["classes"]})
                loaded = torch.jit.load(str(tmp))
            else:
                program = torch.export.export(servable, (images[:2],), dynamic_shapes=({0: batch},))
                torch.export.save(program, str(tmp), extra_files={"classes.json": meta["classes"]})
                loaded = torch.export.load(str(tmp)).module()
            run, runtime = (lambda x: loaded(torch.from_numpy(x)).detach().numpy()), f"torch {torch.__version__}"
        x = images.numpy()
        got = np.concatenate([run(x[:1]), run(x[1:])])
        difference, agree = float(np.abs(got - expected).max()), int((got.argmax(1) == expected.argmax(1)).sum())
        if not difference <= 1e-4 or agree != len(x):  # NaN too
            raise ModelError(f"the {fmt} export disagrees with the checkpoint on {len(x)} test images (probabilities "
                             f"up to {difference:.1e} apart, {len(x) - agree} top classes differ); nothing written")
    if fmt != "onnx":  # the class names beside the file too, where any server can read them
        target.with_name(target.name + ".classes.json").write_text(meta["classes"] + "\n")
    name = checkpoint.name if checkpoint else "the model"
    print(f"Exported {name} as {fmt} to {target} ({target.stat().st_size / 1024:.0f} KiB): uint8 images (N, "
          f"{', '.join(map(str, hp.image_shape))}) -> probabilities of {hp.num_classes} classes")
    print(f"Checked with {runtime} on {len(x)} test images (batches of 1 and {len(x) - 1}): probabilities within "
          f"{difference:.1e} of the checkpoint's, {agree} of {len(x)} top classes the same")
    return {"stage": "export", "format": fmt, "output": str(target), "max_difference": difference, "agree": agree}
