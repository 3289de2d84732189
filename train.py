"""Train, test and use image classifiers with the Lightning CLI.

    python train.py --model cnn                      # the tutorial CNN on CIFAR-10 (configs/cnn.yaml): fit, then test
    python train.py --model mlp                      # the tutorial MLP on MNIST (configs/mlp.yaml)
    python train.py --model mlp --data fashion_mnist --trainer.max_epochs 5 --data.batch_size 256
    python train.py --config configs/tutorial_cnn.yaml   # the tutorial's exact settings
    python train.py test --ckpt_path best            # test the newest run's best checkpoint again
    python train.py predict --ckpt_path best --inputs my_images/
    python train.py export --ckpt_path best --format onnx --output model.onnx

Every run writes lightning_logs/<model>-<data>/version_N/ with TensorBoard events, checkpoints,
config.yaml and results.json. The code behind it is in cli/.
"""

import sys

from cli.main import main

if __name__ == "__main__":
    sys.exit(main())
