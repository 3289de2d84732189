"""Predict throughput on a folder of image files, decoding included: `train.py predict` against a plain torchvision
`ImageFolder` + `DataLoader` loop running the same network, and against decoding the files alone.

    python benchmarks/predict_speed.py --checkpoint CKPT --images DIR [--repeats 3] [--batch_size 256]

CKPT: a checkpoint of train.py (a file, or a run directory: its best). DIR: a folder of images, in class folders for
the torchvision loop (`DIR/<class>/*.jpg`). Every measurement runs in a fresh process, the contenders alternating,
and the table shows the median over --repeats rounds with its range:

- decode only: PIL open + convert (+ resize and crop where the size differs) of every file as predict decodes it,
  one after another in one process, and by a DataLoader with a worker process per core (no network).
- train.py predict: `python train.py predict --ckpt_path CKPT --inputs DIR`; the time it reports itself (from the
  start of `trainer.predict` to the last CSV row: worker start-up, decoding, the network, writing), and the whole
  process (Python, torch and Lightning start-up too).
- torchvision loop: `ImageFolder(DIR, ToTensor + Normalize)` + `DataLoader(batch_size, num_workers = the cores)`,
  the network under `torch.inference_mode()`, softmax, argmax; timed from the first `iter()` to the last batch.
  No resizing: the images must have the network's input size (CIFAR-10's do).

On this project's machines the CIFAR-10 test split as JPEGs comes from the shared data sets:
`mkdir -p /tmp/c10 && tar xzf ../shared/datasets/cifar10-jpeg.tar.gz -C /tmp/c10`, then `--images /tmp/c10/test`.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the project's own modules, for the checkpoint and its preprocessing


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def checkpoint_file(spec: str) -> Path:
    from cli import runs

    return runs.find_checkpoint(spec, Path("lightning_logs").resolve()).path


def decode_only(images: Path, shape: tuple, batch_size: int, workers: int) -> dict:
    """Every file decoded as predict decodes it, and nothing else: one after another in this process (workers 0),
    or by a DataLoader's worker processes into batches, as predict reads them."""
    from torch.utils.data import DataLoader
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from lit_models.preprocessing import ImageFiles

    paths = sorted(p for p in images.rglob("*") if p.name.lower().endswith(IMG_EXTENSIONS))
    files = ImageFiles(paths, shape)
    start = time.perf_counter()
    if workers == 0:
        for i in range(len(files)):
            files[i]
    else:
        for _ in DataLoader(files, batch_size=batch_size, num_workers=workers):
            pass
    return {"images": len(paths), "seconds": time.perf_counter() - start}


def torchvision_loop(checkpoint: Path, images: Path, batch_size: int, workers: int) -> dict:
    """The plain way: ImageFolder + DataLoader + the network, in this one process."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    from lit_models import ImageClassifier

    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    hp = model.hparams
    # ImageFolder's loader gives RGB; the images must already have the network's size (CIFAR-10's do).
    grey = [transforms.Grayscale()] if hp.image_shape[0] == 1 else []
    transform = transforms.Compose([*grey, transforms.ToTensor(), transforms.Normalize(hp.mean, hp.std)])
    dataset = ImageFolder(str(images), transform=transform)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers)
    predicted = []
    start = time.perf_counter()
    with torch.inference_mode():
        for x, _ in loader:
            predicted.append(model.net(x).softmax(1).argmax(1))
    seconds = time.perf_counter() - start
    labels = [model.class_names[i] for i in torch.cat(predicted).tolist()]
    return {"images": len(dataset), "seconds": seconds,
            "labels": dict(zip((str(Path(p)) for p, _ in dataset.samples), labels))}


def train_py_predict(checkpoint: Path, images: Path, batch_size: int, output: Path) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "predict", "--ckpt_path", str(checkpoint),
                           "--inputs", str(images), "--output", str(output), f"--data.eval_batch_size={batch_size}",
                           "--trainer.enable_progress_bar=false"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"train.py predict failed:\n{done.stderr[-3000:]}")
    line = re.search(r"Predicted ([\d,]+) images in ([\d.]+) s", done.stdout)
    images, seconds = int(line.group(1).replace(",", "")), float(line.group(2))
    return {"images": images, "seconds": seconds, "process_seconds": wall}


def in_fresh_process(what: str, args: argparse.Namespace) -> dict:
    done = subprocess.run([sys.executable, __file__, "--_one", what, "--checkpoint", str(args.checkpoint),
                           "--images", str(args.images), "--batch_size", str(args.batch_size)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a train.py checkpoint, or a run directory")
    parser.add_argument("--images", required=True, type=Path, help="a folder of image files in class folders")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three measurements")
    parser.add_argument("--batch_size", type=int, default=256, help="images per batch, for all (predict's default)")
    parser.add_argument("--_one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    checkpoint = checkpoint_file(args.checkpoint)
    if args._one:  # one measurement, in a process of its own
        import torch

        shape = tuple(torch.load(checkpoint, weights_only=True, map_location="cpu")["hyper_parameters"]["image_shape"])
        if args._one == "torchvision":
            result = torchvision_loop(checkpoint, args.images, args.batch_size, cores())
        else:
            result = decode_only(args.images, shape, args.batch_size, 0 if args._one == "decode" else cores())
        print(json.dumps(result))
        return
    rates = {"decode only, 1 process": [], f"decode only, DataLoader with {cores()} workers": [],
             "train.py predict": [], "train.py predict, whole process": [], "torchvision ImageFolder + DataLoader": []}
    agree = None
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            decoded = in_fresh_process("decode", args)
            rates["decode only, 1 process"].append(decoded["images"] / decoded["seconds"])
            loaded = in_fresh_process("decode_loader", args)
            rates[f"decode only, DataLoader with {cores()} workers"].append(loaded["images"] / loaded["seconds"])
            ours = train_py_predict(checkpoint, args.images, args.batch_size, Path(tmp, "p.csv"))
            rates["train.py predict"].append(ours["images"] / ours["seconds"])
            rates["train.py predict, whole process"].append(ours["images"] / ours["process_seconds"])
            plain = in_fresh_process("torchvision", args)
            rates["torchvision ImageFolder + DataLoader"].append(plain["images"] / plain["seconds"])
        import csv

        with open(Path(tmp, "p.csv"), newline="") as f:
            ours_labels = {row["path"]: row["label"] for row in csv.DictReader(f)}
        agree = sum(ours_labels.get(p) == label for p, label in plain["labels"].items())
    print(f"{decoded['images']:,} images in {args.images}, batches of {args.batch_size}, {cores()} cores, "
          f"median (range) of {args.repeats} rounds")
    print("| what | images/s |\n|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {summary(values)} |")
    print(f"The two loops give the same label for {agree:,} of {len(plain['labels']):,} images.")


if __name__ == "__main__":
    main()
