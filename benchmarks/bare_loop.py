"""The floor: a recipe trained by a bare PyTorch loop over the project's own device-resident batches.

Same data module, batches, augmentation, network, optimizer and schedule as `train.py --config RECIPE`
(built from the recipe by the same jsonargparse instantiation LightningCLI uses), but no Lightning:
forward, loss, backward, step. What train.py adds on top of this is the framework's cost. Prints one JSON
line with the per-epoch training times and test accuracies.

    python benchmarks/bare_loop.py --config configs/mlp.yaml --data.data_dir DIR [--data fashion_mnist]
        [--epochs N] [--device cpu|cuda] [--seed 0]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.cli import instantiate_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from datamodules import ImageDataModule, registry  # noqa: E402
from lit_models import ImageClassifier  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a recipe, e.g. configs/cnn.yaml")
    parser.add_argument("--data", help="data module short name, instead of the recipe's")
    parser.add_argument("--data.data_dir", dest="data_dir", required=True)
    parser.add_argument("--epochs", type=int, help="instead of the recipe's max_epochs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0, help="as train.py's --seed_everything")
    args = parser.parse_args()

    recipe = yaml.safe_load(Path(args.config).read_text())
    epochs = args.epochs or recipe["trainer"]["max_epochs"]
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    data_class = registry.class_path(args.data) if args.data else recipe["data"]["class_path"]
    data = instantiate_module(ImageDataModule, {"_class_path": data_class, **recipe["data"].get("init_args", {}),
                                       "data_dir": args.data_dir, "seed": args.seed})
    data.prepare_data()
    data.setup("fit")
    data.splits = {k: (x.to(device), y.to(device)) for k, (x, y) in data.splits.items()}
    model = instantiate_module(ImageClassifier, {**recipe["model"]["init_args"], "image_shape": data.image_shape,
                                                 "num_classes": data.num_classes}).to(device)
    train_batches = data.train_dataloader().batches  # the batches, without the chunks Lightning is handed
    test_batches = data.test_dataloader()
    opt = model.make_optimizer(epochs * len(train_batches))
    optimizer, schedule = opt["optimizer"], opt.get("lr_scheduler", {}).get("scheduler")
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()  # as train.py's precision default
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    epoch_seconds, test_acc, images = [], [], 0
    for epoch in range(epochs):
        model.train()
        train_batches.set_epoch(epoch)
        sync()
        start = time.perf_counter()
        for x, y in train_batches:
            with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(x), y, label_smoothing=model.hparams.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
            images += len(y)
        sync()
        epoch_seconds.append(time.perf_counter() - start)
        model.eval()
        correct = total = 0
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            for x, y in test_batches:
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
        test_acc.append(correct / total)
    print(json.dumps({"epochs": epochs, "batch_size": data.batch_size, "epoch_seconds": epoch_seconds,
                      "test_acc": test_acc, "images_per_second": images / sum(epoch_seconds),
                      "device": str(device)}))


if __name__ == "__main__":
    main()
