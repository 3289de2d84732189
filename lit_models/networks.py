"""The two tutorials' networks, with their widths and depth as arguments, sized from the data they
are given.

The defaults are the tutorials' exact layers: `TutorialCNN((3, 32, 32), 10)` is conv(3->6, k5) pool
conv(6->16, k5) pool, fc 400->120->84->10; `TutorialMLP((1, 28, 28), 10)` is 784->128->10. Other
image shapes change only the input channels and the first fully connected layer.

A network is any `nn.Module` class whose constructor takes `(image_shape, num_classes)` first, then
arguments of its own, and whose forward takes normalised float images (N, C, H, W). It is the
model's `--model.net` part, as LightningCLI takes any class:
`--model.net lit_models.TutorialMLP --model.net.hidden 256`, or in YAML
`net: {class_path: my_package.nets.ResNet, init_args: {width: 64}}`; the image shape and classes
come from the data module. NETWORKS holds the short names (`--model.net mlp`).
"""

import importlib
from collections import OrderedDict
from typing import Union

from torch import nn

from lit_models.checks import ModelError
from lit_models.whitened_net import WhitenedNet


def widths(value: Union[int, list[int]]) -> list[int]:
    """One width or a list of them (one per layer), as a list of positive ints."""
    values = [value] if isinstance(value, int) else list(value)
    if not all(isinstance(v, int) and v > 0 for v in values):
        raise ValueError(f"layer widths must be positive whole numbers, not {value}")
    return values


class TutorialCNN(nn.Sequential):
    """The CIFAR-10 tutorial's LeNet-style CNN (`--model.net cnn`): conv5-ReLU-pool2 blocks, then
    ReLU layers.

    Args:
        channels: output channels of each convolution block (their number is the depth); the
            tutorial's [6, 16].
        hidden: widths of the fully connected hidden layers; the tutorial's [120, 84].
    """

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int,
                 channels: Union[int, list[int]] = [6, 16],
                 hidden: Union[int, list[int]] = [120, 84]):
        in_channels, height, width = image_shape
        convs, fcs = widths(channels), widths(hidden)
        if not convs:
            raise ValueError("the CNN needs at least one convolution block (--model.net.channels)")
        layers = []  # the tutorial's names: conv1, conv2, fc1, fc2, fc3, whatever the depth
        # 5x5 convolutions without padding.
        for i, (a, b) in enumerate(zip([in_channels, *convs], convs)):
            layers += [(f"conv{i + 1}", nn.Conv2d(a, b, 5)), (f"relu{i + 1}", nn.ReLU()),
                       (f"pool{i + 1}", nn.MaxPool2d(2, 2))]
            height, width = (height - 4) // 2, (width - 4) // 2
        if height < 1 or width < 1:
            raise ValueError(f"{len(convs)} conv5-pool2 blocks need larger images than "
                             f"{image_shape[1]}x{image_shape[2]}: use fewer --model.net.channels")
        # flatten, not the tutorial's view(): it also takes channels_last activations
        layers.append(("flatten", nn.Flatten()))
        sizes = [convs[-1] * height * width, *fcs, num_classes]
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers += [(f"fc{i + 1}", nn.Linear(a, b)), (f"fc_relu{i + 1}", nn.ReLU())]
        super().__init__(OrderedDict(layers[:-1]))


class TutorialMLP(nn.Sequential):
    """The MNIST tutorial's MLP (`--model.net mlp`): input -> hidden ReLU layers -> classes.

    Args:
        hidden: the width of the hidden layer, or a list of widths, one per hidden layer; the
            tutorial's 128.
    """

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int,
                 hidden: Union[int, list[int]] = 128):
        pixels = image_shape[0] * image_shape[1] * image_shape[2]
        sizes = [pixels, *widths(hidden), num_classes]
        layers = [("flatten", nn.Flatten())]
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):  # the tutorial's names: fc1, relu, fc2
            layers += [(f"fc{i + 1}", nn.Linear(a, b)), (f"relu{i + 1}", nn.ReLU())]
        super().__init__(OrderedDict(layers[:-1]))


NETWORKS: dict[str, type[nn.Module]] = {"cnn": TutorialCNN, "mlp": TutorialMLP,
                                         "whitened": WhitenedNet}


def import_class(path: str) -> type:
    """The class an import path `package.module.Class` names (ImportError or AttributeError if
    none)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def network_class(name: str) -> type[nn.Module]:
    """The network class `name` names: a key of NETWORKS, or an import path (of an nn.Module class,
    or of a function that builds one: torchvision's `torchvision.models.resnet18`)."""
    try:
        return NETWORKS.get(name) or import_class(name)
    except (ImportError, AttributeError, ValueError):
        raise ModelError(f"--model.net {name!r} is not a network: use one of "
                         f"{', '.join(NETWORKS)}, or an nn.Module class's import path") from None
