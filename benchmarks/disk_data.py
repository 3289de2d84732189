"""Training batches from disk against from memory, on one image folder: images/s of an epoch of
DeviceBatches as training draws them (shuffled, full batches), each measurement a fresh process, the
modes in turns.

    # writes a 3.2 GB (decoded) folder in --work
    python benchmarks/disk_data.py --make 10500 --pairs 5
    python benchmarks/disk_data.py --root DIR --pairs 5 --crop 4 --flip
    PYTHONPATH=DIR_WITH_LITDATA python benchmarks/disk_data.py --make 10500 --litdata

Modes:
  memory     --data.in_memory true: the cache read whole into memory, batches cut by index_select
  disk       --data.in_memory false: each batch read from the cache file (DiskImages), the file in
             the page cache
  disk-cold  the same, the file's pages evicted first (posix_fadvise DONTNEED): read from the device
  litdata    (--litdata) the same images written by litdata.optimize, read by StreamingDataset in
             the same order (dataset[i]; 8 batches only)
  litdata-loader  (--litdata) StreamingDataLoader over a shuffled StreamingDataset: its own order,
             2 workers
Each row: the median and range of images/s over --pairs rounds, the time to be ready (the cache
opened or read), and the process's peak RSS. The images are decoded once beforehand (train.py's
cache), not timed.
"""

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_folder(root: Path, n: int, size: int) -> None:
    """n training JPEGs (and 64 test) in 4 classes: a few distinct files' bytes, written again and
    again."""
    from PIL import Image

    for k in range(4):
        image = Image.new("RGB", (size, size), (60 * k, 90, 200 - 40 * k))
        image.paste((230, 230, 230), (k * size // 4, 0, (k + 1) * size // 4, size // 4))
        image.save(jpeg := io.BytesIO(), "JPEG", quality=90)
        for split, count in (("train", n // 4), ("test", 16)):
            (root / split / f"c{k}").mkdir(parents=True, exist_ok=True)
            for i in range(count):
                (root / split / f"c{k}" / f"{i:05d}.jpg").write_bytes(jpeg.getvalue())


def data_module(args, in_memory: bool):
    from datamodules import ImageFolderDataModule

    return ImageFolderDataModule(root=str(args.root), data_dir=str(args.work / "data"),
                                 batch_size=args.batch_size, in_memory=in_memory,
                                 crop_padding=args.crop, flip=args.flip)


def train_cache(args) -> Path:
    (path,) = (args.work / "data" / "cache").glob(f"image_folder-{args.root.name}-*-train-*.npy")
    return path


def read_cache(index: int, path: str):
    import numpy as np
    import torch

    return torch.from_numpy(np.array(np.load(path, mmap_mode="r")[index]))


def child(args) -> dict:
    """One measurement in this process: ready time, an epoch's images/s, peak RSS."""
    import torch

    if args.child.startswith("litdata"):
        from litdata import StreamingDataLoader, StreamingDataset
    else:
        import datamodules  # noqa: F401  (imported before the clock starts, as litdata is)
    start = time.perf_counter()
    if args.child.startswith("litdata"):
        dataset = StreamingDataset(str(args.work / "litdata"),
                                   shuffle=args.child == "litdata-loader", seed=0)
        if args.child == "litdata-loader":
            batches = StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=2,
                                          drop_last=True)
        else:
            # the order DeviceBatches draws (its train split is a seeded permutation of these rows)
            order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))
            # slow: 8 batches
            batches = (torch.stack([dataset[i] for i in order[b:b + args.batch_size].tolist()])
                       for b in range(0, min(len(order), 8 * args.batch_size), args.batch_size))
    else:
        data = data_module(args, in_memory=args.child == "memory")
        data.setup("fit")
        if args.child == "disk-cold":
            fd = os.open(train_cache(args), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        batches = (images for images, _ in data.train_dataloader())
    ready = time.perf_counter() - start
    start, images = time.perf_counter(), 0
    for batch in batches:
        images += len(batch)
    seconds = time.perf_counter() - start
    return {"mode": args.child, "ready_s": ready, "images": images,
            "images_per_s": images / seconds,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def measure(args, modes: list[str]) -> dict[str, list[dict]]:
    """--pairs rounds of the modes in turns, each measurement a fresh process: each mode's rows."""
    rows = {mode: [] for mode in modes}
    for round_ in range(args.pairs):
        for mode in modes:
            argv = sys.argv[1:] + ["--child", mode, "--root", str(args.root),
                                   "--work", str(args.work)]
            proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"disk_data.py: {mode} failed:\n{proc.stderr[-3000:]}")
            rows[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1} {mode}: {rows[mode][-1]['images_per_s']:,.0f} images/s",
                  flush=True)
    return rows


def spread(runs, key, fmt):
    values = [r[key] for r in runs]
    return (f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(min(values))}-{fmt.format(max(values))})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, help="an image folder (train/<class>/, test/<class>/)")
    parser.add_argument("--make", type=int, metavar="N",
                        help="write a folder of N training JPEGs in --work")
    parser.add_argument("--size", type=int, default=320, help="their side, with --make")
    parser.add_argument("--work", type=Path, default=Path("/tmp/disk_data_benchmark"))
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--crop", type=int, default=0, help="--data.crop_padding")
    parser.add_argument("--flip", action="store_true", help="--data.flip true")
    parser.add_argument("--litdata", action="store_true",
                        help="also LitData's optimize and StreamingDataset")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make:
        args.root = args.work / f"folder{args.make}x{args.size}"
        if not args.root.is_dir():
            make_folder(args.root, args.make, args.size)
    if args.root is None:
        sys.exit("disk_data.py: --root DIR or --make N")
    if args.child:
        print(json.dumps(child(args)))
        return
    start = time.perf_counter()
    data = data_module(args, in_memory=False)
    data.prepare_data()  # decoded once, as train.py does; not timed below
    cache = train_cache(args)
    print(f"{args.root}: {len(data.read('train')[0]):,} training images {data.image_shape}, "
          f"cache {cache} ({cache.stat().st_size / 1e9:.2f} GB), "
          f"ready in {time.perf_counter() - start:.0f} s", flush=True)
    modes = ["memory", "disk", "disk-cold"]
    if args.litdata:
        modes += ["litdata", "litdata-loader"]
        if not (args.work / "litdata").is_dir():
            from functools import partial

            from litdata import optimize

            start = time.perf_counter()
            optimize(fn=partial(read_cache, path=str(cache)),
                     inputs=list(range(len(data.read("train")[0]))),
                     output_dir=str(args.work / "litdata"), chunk_bytes="64MB", num_workers=2)
            print(f"litdata.optimize of the decoded cache: {time.perf_counter() - start:.0f} s",
                  flush=True)
    rows = measure(args, modes)
    print(f"\n| batch {args.batch_size}, crop {args.crop}, flip {args.flip}, {args.pairs} rounds "
          f"| images/s | ready s | peak RSS GB |\n|---|---|---|---|")
    for mode, runs in rows.items():
        print(f"| {mode} | {spread(runs, 'images_per_s', '{:,.0f}')} "
              f"| {spread(runs, 'ready_s', '{:.1f}')} | {spread(runs, 'peak_rss_gb', '{:.2f}')} |")


if __name__ == "__main__":
    main()
