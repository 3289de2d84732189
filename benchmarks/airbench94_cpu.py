r"""airbench94 (its pip package, unchanged) trained on this machine's CPU and CIFAR-10 copy: the
reference beside `train.py --model whitened` where no GPU is lent (docs/benchmarks.md, issue 51).

airbench writes its code for one CUDA device in half precision. Here its own `train94` runs with
four things swapped for the run's length, and nothing of its recipe: the network is built on the
host in float32 (`.cuda()` and `.half()` pass it on), its loaders hold their images on the host in
float32 (rounded to half precision first, as airbench's are), and torch.cuda's timing events are
the host's clock. The data is written where airbench reads it
(`cifar10/train.pt` and `test.pt` in the working folder) from torchvision's CIFAR-10 layout.

    pip install airbench==0.1.8
    cd SCRATCH && PYTHONPATH=PROJECT/../shared/datasets/offline_cifar10 \
        python PROJECT/benchmarks/airbench94_cpu.py --data_dir /tmp/c10 --seed 0

Prints airbench's own table (its last row's tta_val_acc is the test accuracy it reports) and the
wall time.
"""

import argparse
import time
from pathlib import Path
from unittest import mock

import torch
import torchvision


class HostEvent:
    """torch.cuda.Event's timing, on the host's clock."""

    def __init__(self, enable_timing: bool = True):
        self.seconds = 0.0

    def record(self) -> None:
        self.seconds = time.perf_counter()

    def elapsed_time(self, end: "HostEvent") -> float:
        return 1e3 * (end.seconds - self.seconds)


def write_data(data_dir: str) -> None:
    """cifar10/train.pt and test.pt, as airbench saves them after its download."""
    Path("cifar10").mkdir(exist_ok=True)
    for train, name in ((True, "train.pt"), (False, "test.pt")):
        data = torchvision.datasets.CIFAR10(data_dir, train=train, download=False)
        torch.save({"images": torch.tensor(data.data), "labels": torch.tensor(data.targets),
                    "classes": data.classes}, Path("cifar10", name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="torchvision's CIFAR-10 layout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=float, default=9.9, help="airbench94's own 9.9")
    args = parser.parse_args()
    write_data(args.data_dir)
    import airbench
    from airbench import lib_airbench94, utils

    class HostLoader(utils.CifarLoader):
        def __init__(self, path, **kwargs):
            super().__init__(path, gpu="cpu", **kwargs)
            self.images = self.images.float()

    torch.manual_seed(args.seed)
    start = time.perf_counter()
    with (mock.patch.object(torch.nn.Module, "cuda", lambda module, *a, **k: module),
          mock.patch.object(torch.nn.Module, "half", lambda module: module),
          mock.patch.object(torch.cuda, "Event", HostEvent),
          mock.patch.object(torch.cuda, "synchronize", lambda *a: None),
          mock.patch.object(utils, "CifarLoader", HostLoader)):
        loader = HostLoader("cifar10", train=True, batch_size=1024,
                            aug=lib_airbench94.hyp["aug"], altflip=True)
        airbench.train94(train_loader=loader, epochs=args.epochs)
    print(f"airbench94 on the CPU ({torch.get_num_threads()} threads), seed {args.seed}: "
          f"{time.perf_counter() - start:.1f} s in all")


if __name__ == "__main__":
    main()
