"""Experiments: run many train.py command lines as one Optuna study, compare them, and keep the best.

    python sweep.py --model mlp --data fashion_mnist --space configs/sweeps/mlp.yaml --trials 24 --parallel 2
    python sweep.py --model cnn --grid "model.optimizer.lr=0.02,0.05,0.1" --seeds 3
    python sweep.py --model mlp --seeds 5                    # one setting, five seeds: mean ± std

Everything that is not a sweep option is a train.py option; each trial is that command line plus its
settings, and `python train.py` with them runs it again. The study (study.db), one TensorBoard run per trial,
summary.csv and best.yaml go to lightning_logs/sweeps/NAME/. The code behind it is in experiments/.
"""

import sys

from experiments.main import main

if __name__ == "__main__":
    sys.exit(main())
