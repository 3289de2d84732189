"""The two tutorials' networks, exactly as they define them, sized from the data they are given.

With the tutorials' own data the layer sizes are the tutorials': `TutorialCNN((3, 32, 32), 10)` is
conv(3->6, k5) pool conv(6->16, k5) pool, fc 400->120->84->10; `TutorialMLP((1, 28, 28), 10)` is
784->128->10. Other image shapes change only the input channels and the first fully connected layer.
"""

import torch
import torch.nn.functional as F
from torch import nn


class NetworkShapeError(ValueError):
    """The network cannot be built for the data's image shape."""


class TutorialCNN(nn.Module):
    """The CIFAR-10 tutorial's LeNet-style CNN (`--model.arch cnn`)."""

    def __init__(self, image_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10):
        super().__init__()
        channels, height, width = image_shape
        self.conv1 = nn.Conv2d(channels, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        # Spatial size after conv5-pool2-conv5-pool2: 32 -> 28 -> 14 -> 10 -> 5 on CIFAR-10.
        h, w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
        if h < 1 or w < 1:
            raise NetworkShapeError(f"the tutorial CNN needs images of at least 16x16 pixels, these are "
                                    f"{height}x{width}; "
                                    f"use --data.image_size 16 (or more) for an image folder, or --model mlp")
        self.fc1 = nn.Linear(16 * h * w, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        # flatten, not the tutorial's view(): it also accepts channels_last activations.
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class TutorialMLP(nn.Module):
    """The MNIST tutorial's MLP, input -> 128 -> classes with ReLU (`--model.arch mlp`)."""

    def __init__(self, image_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10,
                 hidden_size: int = 128):
        super().__init__()
        channels, height, width = image_shape
        self.fc1 = nn.Linear(channels * height * width, hidden_size)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(torch.flatten(x, 1))))


NETWORKS = {"cnn": TutorialCNN, "mlp": TutorialMLP}
