r"""The floor: a recipe trained by a bare PyTorch loop over the project's own device batches.

Same data module, batches, augmentation, model (normalisation and network), optimizer and schedule
as `train.py --model RECIPE` (built from the same command line by the same TrainCLI), but no
Lightning: forward, loss, backward, step. What train.py adds on top of this is the framework's cost.
Prints one JSON line with the per-epoch training times and test accuracies (`train_bare(args)`
returns them: benchmarks/loop_cost.py).

    python benchmarks/bare_loop.py --model mlp --data FashionMNISTDataModule --data.data_dir DIR \
        --trainer.max_epochs 5
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402


def train_bare(args: list[str]) -> dict:
    """Train the recipe of the command line `args` (train.py's options) in a bare loop: each epoch's
    training seconds and test accuracy, the batch size, the steps per epoch and the device."""
    quiet = ["--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    cli = train.TrainCLI(args + quiet, run=False)
    device = cli.trainer.strategy.root_device
    data, recipe = cli.datamodule, cli.model
    data.trainer = cli.trainer  # its splits go to the trainer's device, as in a fit
    data.prepare_data()
    data.setup("fit")
    hp = {k: v for k, v in recipe.hparams.items()
          if not k.startswith("_") and k not in ("optimizer", "scheduler")}
    hp.update(image_shape=data.image_shape, num_classes=len(data.classes),
              mean=hp["mean"] or data.mean, std=hp["std"] or data.std)
    model = type(recipe)(**hp, optimizer=recipe.optimizer_factory,
                         scheduler=recipe.scheduler_factory).to(device)
    batches, test_batches = data.train_dataloader(), data.test_dataloader()
    epochs = cli.trainer.max_epochs
    optimizer = model.optimizer_factory(model.parameters())
    schedule = None
    if model.scheduler_factory is not None:
        schedule = model.scheduler_factory(optimizer, total_steps=epochs * len(batches))
    bf16 = str(cli.trainer.precision).startswith("bf16")
    smoothing = hp["label_smoothing"]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    epoch_seconds, test_acc, images = [], [], 0
    for epoch in range(epochs):
        model.train()
        batches.set_epoch(epoch)
        sync()
        start = time.perf_counter()
        for x, y in batches:
            with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(x), y, label_smoothing=smoothing)
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
    return {"epochs": epochs, "batch_size": data.batch_size, "steps": len(batches),
            "epoch_seconds": epoch_seconds, "test_acc": test_acc,
            "images_per_second": images / sum(epoch_seconds), "device": str(device)}


def main() -> None:
    print(json.dumps(train_bare(sys.argv[1:])))


if __name__ == "__main__":
    main()
