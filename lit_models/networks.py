"""The two tutorials' networks, exactly as they define them, sized from the data they are given.

With the tutorials' own data the layer sizes are the tutorials': `TutorialCNN((3, 32, 32), 10)` is
conv(3->6, k5) pool conv(6->16, k5) pool, fc 400->120->84->10; `TutorialMLP((1, 28, 28), 10)` is
784->128->10. Other image shapes change only the input channels and the first fully connected layer.

A network is any `nn.Module` class whose constructor takes `(image_shape, num_classes)` and whose forward
takes normalised float images (N, C, H, W). `--model.arch` names one in NETWORKS, or any such class by its
import path (`--model.arch my_package.nets.ResNet`).
"""

import importlib

import torch
import torch.nn.functional as F
from torch import nn


class TutorialCNN(nn.Module):
    """The CIFAR-10 tutorial's LeNet-style CNN (`--model.arch cnn`)."""

    def __init__(self, image_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10):
        super().__init__()
        channels, height, width = image_shape
        # Spatial size after conv5-pool2-conv5-pool2: 32 -> 28 -> 14 -> 10 -> 5 on CIFAR-10.
        h, w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
        if h < 1 or w < 1:
            raise ValueError(f"the tutorial CNN needs images of at least 16x16 pixels, these are {height}x{width}")
        self.conv1 = nn.Conv2d(channels, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * h * w, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)  # not the tutorial's view(): flatten also takes channels_last activations
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class TutorialMLP(nn.Module):
    """The MNIST tutorial's MLP, input -> 128 -> classes with ReLU (`--model.arch mlp`)."""

    def __init__(self, image_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10):
        super().__init__()
        channels, height, width = image_shape
        self.fc1 = nn.Linear(channels * height * width, 128)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(torch.flatten(x, 1))))


NETWORKS: dict[str, type[nn.Module]] = {"cnn": TutorialCNN, "mlp": TutorialMLP}


def network_class(arch: str) -> type[nn.Module]:
    """The network class `arch` names: a key of NETWORKS, or an import path `package.module.Class`."""
    if arch in NETWORKS:
        return NETWORKS[arch]
    module_name, _, class_name = arch.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"--model.arch {arch!r} is not a network: use one of {', '.join(NETWORKS)}, or the "
                         f"import path of an nn.Module class taking (image_shape, num_classes)")
    return cls
