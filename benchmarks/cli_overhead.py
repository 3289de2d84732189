"""What train.py costs besides the work: one command line run in-process again and again.

    python benchmarks/cli_overhead.py --ckpt_path lightning_logs/version_0/checkpoints/last.ckpt

Runs `train.py test --ckpt_path CKPT` (no progress bar, no logger) `--repeats` times in this
process, after one run that warms the imports and caches up, and prints the median and range of
the seconds each took: parsing, building the model and data, the test of a small data set.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    args = ["test", "--ckpt_path", opts.ckpt_path, "--trainer.enable_progress_bar=false",
            "--trainer.logger=false"]
    seconds = []
    for _ in range(opts.repeats + 1):
        start = time.perf_counter()
        if train.main(args) != 0:
            raise SystemExit("the test command failed")
        seconds.append(time.perf_counter() - start)
    seconds = seconds[1:]
    print(f"test --ckpt_path in-process: median {statistics.median(seconds):.2f} s "
          f"(range {min(seconds):.2f}-{max(seconds):.2f}) over {opts.repeats} runs")


if __name__ == "__main__":
    main()
