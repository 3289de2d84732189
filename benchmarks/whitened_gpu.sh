#!/usr/bin/env bash
# The strong baseline on a GPU (issue 51): `train.py --model whitened` on five seeds, with airbench94
# timed before and after them on the same host and the same CIFAR-10 copy. A cut of
# ../shared/gpu/check.sh: on the GPU host, from the project root, after `bash ../shared/gpu/stage.sh`
# put .gpu/ here (airbench's package with it), `bash benchmarks/whitened_gpu.sh`. About 4 minutes;
# what it prints and every run's folder land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/whitened.log") 2>&1
pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .gpu/wheels/airbench-*.tar.gz
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
D=/tmp/gpu-data
python .gpu/data/cifar10_jpeg.py --torchvision $D/c10 >/dev/null
ln -sfn $D/c10 $D/cifar10  # airbench reads torchvision's CIFAR-10 from ./cifar10
C10="env PYTHONPATH=/tmp/site:$PWD:$PWD/.gpu/data/offline_cifar10"
cat > $D/airbench94.py <<'PY'
import time

import airbench

airbench.warmup94()  # as check.sh times it: after its own warm-up, one run
start = time.perf_counter()
airbench.train94()
print(f"airbench94 wall {time.perf_counter() - start:.2f} s")
PY
# Its time to compare is its table's last total_time_seconds (training, whitening, test-time views):
# the wall line also holds its loading and the per-epoch evaluations it prints.
airbench94() { (cd $D && $C10 timeout 200 python airbench94.py 2>&1 | tail -3); }
echo "== airbench94, before"; airbench94
RUN=(--model whitened --data.data_dir $D/c10 --trainer.default_root_dir "$OUT/whitened")
for s in 0 1 2 3 4; do
  echo "== train.py ${RUN[*]} --seed_everything $s --trainer.enable_progress_bar false"
  $C10 timeout 200 python train.py "${RUN[@]}" --seed_everything $s --trainer.enable_progress_bar false 2>&1 | tail -1
done
echo "== airbench94, after"; airbench94
python - "$OUT"/whitened/lightning_logs/version_*/results.json <<'PY'
import json
import statistics
import sys

runs = [json.load(open(path)) for path in sys.argv[1:]]
accuracy, fit = [r["metrics"]["test/acc"] for r in runs], [r["fit_seconds"] for r in runs]
print("test/acc", [round(a, 4) for a in accuracy], "mean", round(statistics.mean(accuracy), 4))
print("fit s", [round(f, 2) for f in fit], "median", round(statistics.median(fit), 2))
print({key: runs[0].get(key) for key in ("device", "precision", "epochs")})
PY
