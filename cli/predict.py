"""`python train.py predict --ckpt_path CKPT [--inputs PATH ...] [--output FILE] [--top_k K]`: classify images with
a trained model and write every prediction to a CSV file.

    python train.py predict --ckpt_path best --inputs my_images/ photo.jpg 'scans/*.png'
    python train.py predict --ckpt_path lightning_logs/cnn-cifar10/version_3   # the test split, with true labels

Lightning's predict loop does the work: `trainer.predict` runs the batches through the model's `predict_step` on
the device and a `BasePredictionWriter` writes each batch's rows as they come. With `--inputs`, DataLoader worker
processes decode the files (the model's own `fit_image`: its channels, resized and centre-cropped to its input
size) and the model normalises the uint8 batches with the training set's statistics, which its checkpoint carries.
Without `--inputs`, it predicts its data set's test split and writes the true labels too (the tutorial's
GroundTruth / Predicted).
"""

import csv
import glob
import json
import os
import sys
import time
import warnings
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader
from torchvision.datasets.folder import IMG_EXTENSIONS

from cli import app, runs
from cli.args import UsageError
from datamodules import DataSetupError
from lit_models.preprocessing import ImageFiles

SHOWN = 8  # predictions printed, spread over the images (a folder or split is often sorted by class)
NAMED_FAILURES = 10  # unreadable files named one by one; the rest are counted


def run(checkpoint: runs.Checkpoint, argv: list[str]) -> dict:
    """`predict`: the predictions of `checkpoint` for --inputs (or its test split), written to a CSV file."""
    with_files = any(a == "--inputs" or a.startswith("--inputs=") for a in argv)
    argv = one_device(with_checkpoint_data(argv, checkpoint) if with_files else argv)
    model, data, trainer, run_ = app.build("predict", argv, checkpoint=checkpoint)
    config = run_.config
    if trainer.world_size > 1:
        raise UsageError("predict runs in one process on one device; leave out --trainer.devices/num_nodes/strategy")
    top_k = config["top_k"]
    if top_k < 1:
        raise UsageError(f"--top_k {top_k}: list at least 1 class per image")
    top_k = min(top_k, model.hparams.num_classes)
    if config["inputs"]:
        paths = find_images(config["inputs"])
        loader = files_loader(paths, model.hparams.image_shape, data, trainer)
        names, what = [str(p) for p in paths], f"{len(paths):,} images"
    else:
        runs.check_compatible(checkpoint, model, data.name)  # the run's data set may have changed since
        loader, names, what = None, None, f"the test split of {data.name}"
    output = Path(config["output"]).expanduser() if config["output"] else default_output(checkpoint)
    # The weights of the checkpoint read and checked already (runs.read_checkpoint). trainer.predict(ckpt_path=)
    # would read the file again and restore the training callbacks' states, of no use here (and warned about).
    model.load_state_dict(checkpoint.contents["state_dict"])
    print(f"Predicting {what} with {checkpoint.path.name}", flush=True)
    file = CsvFile(output, overwrite=bool(config["output"]))
    with file, cpu_threads(trainer, loader.num_workers if loader else 0), warnings.catch_warnings():
        # The writer counts rows itself; the workers are chosen in files_loader; and Lightning 2.6's own use of a
        # torch 2.14 deprecation.
        warnings.filterwarnings("ignore", "Couldn't infer the batch indices")
        warnings.filterwarnings("ignore", r"The '\w+_dataloader' does not have many workers")
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        writer = PredictionWriter(file.handle, model.class_names, top_k, names)
        trainer.callbacks.append(writer)
        start = time.perf_counter()
        trainer.predict(model, dataloaders=loader, datamodule=None if loader else data, return_predictions=False)
        seconds = time.perf_counter() - start
        if writer.written == 0:
            first = writer.failures[0] if writer.failures else ("", "no images")
            raise DataSetupError(f"none of the {writer.seen} images could be read (e.g. {first[0]}: {first[1]}); "
                                 f"nothing written")
    return report(writer, file.path, seconds, trainer)


def files_loader(paths: list[Path], image_shape: tuple, data, trainer) -> DataLoader:
    """Batches of `--data.eval_batch_size` files, decoded by `--data.num_workers` worker processes (all cores unless
    told otherwise), or in this process when there is one batch only: a worker would add its start-up and no speed."""
    batches = -(-len(paths) // data.eval_batch_size)
    workers = min(data.num_workers, batches) if batches > 1 else 0
    return DataLoader(ImageFiles(paths, image_shape), batch_size=data.eval_batch_size, num_workers=workers,
                      collate_fn=ImageFiles.collate, pin_memory=trainer.strategy.root_device.type == "cuda")


@contextmanager
def cpu_threads(trainer, workers: int):
    """On a CPU, leave the cores that decode files to the worker processes: the model's threads on the same cores
    wait on each other (10,000 CIFAR-10 JPEGs, 2 cores, 2 workers, a VM shared with other jobs: 1.2-2.4 s with
    one model thread, 3.7-5.9 s with torch's default of two)."""
    before = torch.get_num_threads()
    if trainer.strategy.root_device.type == "cpu" and workers:
        torch.set_num_threads(max(1, cpu_count() - workers))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_device(argv: list[str]) -> list[str]:
    """Predicting needs no second process: one device, unless the user asks for more (after the run's config)."""
    at = after_config(argv)
    return argv[:at] + ["--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto"] + argv[at:]


def after_config(argv: list[str]) -> int:
    """Where options go that the run's config sets and the user may override: after its `--config FILE`."""
    return 2 if argv[:1] == ["--config"] else 0


def with_checkpoint_data(argv: list[str], checkpoint: runs.Checkpoint) -> list[str]:
    """The command line with `CheckpointData` for the run's data module, answering the links from the checkpoint.

    Placed right after the run's config, so that the training set's mean and std (which `checkpoint_argv` puts
    next) and the user's own --data.eval_batch_size / --data.num_workers still apply.
    """
    hp = checkpoint.hparams
    classes = list(hp.get("class_names") or map(str, range(hp["num_classes"])))
    # Decoding files: every core, not the run's setting; and batches of 256, not the run's evaluation batches of
    # 1000 on the device: the first arrives sooner, and on a CPU the CNN ran 1.5x faster at 128-256 (cache-sized).
    data = {"class_path": "datamodules.CheckpointData",
            "init_args": {"image_shape": list(hp["image_shape"]), "classes": classes, "num_workers": cpu_count(),
                          "eval_batch_size": 256}}
    at = after_config(argv)
    return argv[:at] + [f"--data={json.dumps(data)}"] + argv[at:]


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def find_images(inputs: list[str]) -> list[Path]:
    """The image files that --inputs names: files as given, folders searched recursively for image files (by
    extension, sorted), and globs (`**` included). Each input must match at least one image."""
    found, kinds = [], " ".join(IMG_EXTENSIONS)
    for spec in inputs:
        path = Path(spec).expanduser()
        if path.is_file():
            matches = [path]  # named explicitly: tried whatever its extension, and reported if unreadable
        elif path.is_dir():
            matches = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(IMG_EXTENSIONS))
            if not matches:
                raise DataSetupError(f"--inputs {spec}: the folder has no image files ({kinds})")
        elif glob.has_magic(spec):
            matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)
                             if Path(p).is_file() and p.lower().endswith(IMG_EXTENSIONS))
            if not matches:
                raise DataSetupError(f"--inputs {spec}: matches no image files ({kinds})")
        else:
            raise DataSetupError(f"--inputs {spec}: no such file or folder")
        found += matches
    return found


def default_output(checkpoint: runs.Checkpoint) -> Path:
    """Where predictions go without --output: a new timestamped file beside the checkpoint's run (or beside the
    checkpoint file), so that earlier predictions are never overwritten."""
    return free_path((checkpoint.run_dir or checkpoint.path.parent) / f"predictions-{datetime.now():%Y%m%d-%H%M%S}.csv")


def free_path(path: Path) -> Path:
    """`path`, or `stem-1.suffix`, `stem-2.suffix`, ... : the first that does not exist."""
    k, free = 1, path
    while free.exists():
        free, k = path.with_name(f"{path.stem}-{k}{path.suffix}"), k + 1
    return free


class CsvFile:
    """A CSV file written whole or not at all: rows go to a hidden temporary file beside it, renamed into place
    when all went well and removed otherwise. Without `overwrite`, an existing file is never replaced."""

    def __init__(self, path: Path, overwrite: bool):
        self.path, self.overwrite = path, overwrite
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.handle = None

    def __enter__(self):
        if self.path.is_dir():
            raise UsageError(f"--output {self.path} is a folder; name a file")
        try:
            self.handle = open(self.tmp, "w", newline="", encoding="utf-8")
        except OSError as e:
            raise UsageError(f"--output {self.path} cannot be written ({e.strerror})") from None
        return self

    def __exit__(self, kind, value, traceback):
        self.handle.close()
        if kind is not None:
            self.tmp.unlink(missing_ok=True)
            return False
        if self.overwrite:
            os.replace(self.tmp, self.path)
            return False
        while True:  # a hard link is made only if nothing is there yet: another run's file is never replaced
            try:
                os.link(self.tmp, self.path)
                break
            except FileExistsError:
                self.path = free_path(self.path)
        self.tmp.unlink()
        return False


class PredictionWriter(BasePredictionWriter):
    """CSV rows for each batch as Lightning's predict loop produces it: `path,label,probability`, the next
    top-k classes and their probabilities, and `true_label` when predicting a labelled split.

    Batches of files are `(uint8 images, {index: error})`: a file that could not be read is skipped and counted.
    Batches of a data set's split are `(images, labels)`.
    """

    def __init__(self, handle, class_names: list[str], top_k: int, names: list[str] | None):
        super().__init__(write_interval="batch")
        self.class_names, self.top_k, self.names = class_names, top_k, names
        self.with_truth = names is None
        self.csv = csv.writer(handle)
        self.seen = self.written = self.correct = 0
        self.failures: list[tuple[str, str]] = []
        self.shown: list[list[str]] = []
        header = ["path", "label", "probability"]
        for k in range(2, top_k + 1):
            header += [f"top{k}", f"top{k}_probability"]
        self.csv.writerow(header + (["true_label"] if self.with_truth else []))

    def on_predict_start(self, trainer, pl_module):
        if self.names is None:  # a split of the data module: set up by now
            self.names = split_names(trainer.datamodule, "test")
        self.show_at = {i * len(self.names) // SHOWN for i in range(SHOWN)}

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        probabilities, classes = prediction.topk(self.top_k, dim=1)
        probabilities, classes = probabilities.float().cpu().tolist(), classes.cpu().tolist()
        truths = batch[1].cpu().tolist() if self.with_truth else None
        for i, (p, c) in enumerate(zip(probabilities, classes)):
            name = self.names[self.seen + i]
            if not self.with_truth and i in batch[1]:
                self.failures.append((name, batch[1][i]))
                if len(self.failures) <= NAMED_FAILURES:
                    print(f"train.py: skipped {name}: cannot read it ({batch[1][i]})", file=sys.stderr)
                continue
            row = [name]
            for k in range(self.top_k):
                row += [self.class_names[c[k]], f"{p[k]:.6f}"]
            if truths is not None:
                row.append(self.class_names[truths[i]])
                self.correct += c[0] == truths[i]
            self.csv.writerow(row)
            self.written += 1
            if self.seen + i in self.show_at:
                self.shown.append(row)
        self.seen += len(probabilities)


def split_names(data, split: str) -> list[str]:
    """A name for each image of a data module's split: its file where the split is one file per image (an image
    folder), else `<data set>:<split>:<index>` (CIFAR-10's pickles, MNIST's IDX files)."""
    count = len(data.splits[split][1])
    try:
        files = data.source_files(split)
    except Exception:
        files = []
    if len(files) == count:
        return [str(f) for f in files]
    return [f"{data.name}:{split}:{i}" for i in range(count)]


def report(writer: PredictionWriter, output: Path, seconds: float, trainer) -> dict:
    """Print a few predictions and the summary; the record of the run (for tests and sweeps)."""
    if writer.with_truth:
        width = max(len(name) for name in writer.class_names)
        print("GroundTruth:  " + " ".join(f"{row[-1]:{width}s}" for row in writer.shown).rstrip())
        print("Predicted:    " + " ".join(f"{row[1]:{width}s}" for row in writer.shown).rstrip())
    else:
        width = min(60, max((len(row[0]) for row in writer.shown), default=0))
        for row in writer.shown:
            others = ", ".join(f"{row[i]} {float(row[i + 1]):.3f}" for i in range(3, len(row) - 1, 2))
            then = f"; then {others}" if others else ""
            print(f"{row[0][-width:]:{width}s}  {row[1]} ({float(row[2]):.3f}){then}")
    if writer.written > len(writer.shown):
        print(f"({len(writer.shown)} of {writer.written:,} shown; all of them in the CSV file)")
    rate = writer.seen / seconds if seconds > 0 else float("nan")
    parts = [f"Predicted {writer.written:,} images in {seconds:.2f} s ({rate:,.0f} images/s, reading included) "
             f"on {app.device_description(trainer)}"]
    accuracy = writer.correct / writer.written if writer.with_truth and writer.written else None
    if accuracy is not None:
        parts.append(f"accuracy {accuracy:.4f} ({writer.correct:,} of {writer.written:,} right)")
    if writer.failures:
        parts.append(f"{len(writer.failures):,} unreadable file{'s' if len(writer.failures) > 1 else ''} skipped")
    print("; ".join(parts) + f"; wrote {output}")
    return {"stage": "predict", "output": str(output), "images": writer.written, "unreadable": len(writer.failures),
            "seconds": round(seconds, 3), "images_per_second": round(rate, 1), "accuracy": accuracy,
            "failures": [name for name, _ in writer.failures]}
