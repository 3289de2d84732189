"""A small convolutional network for a strong CIFAR-10 baseline in few epochs (`--model.net
whitened`, the recipe `--model whitened`), after the published fast CIFAR-10 trainers (Page's
ResNet-9, hlb-CIFAR10, airbench94): a fixed patch-extraction stem, then groups of two 3x3
convolutions with batch norm, each group halving the resolution.

    whiten   k x k convolution, no padding: 2 * C * k * k channels; frozen
    group i  conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU   (widths[i] channels)
    head     global max pool -> linear (no bias) -> x 1/9

The stem is frozen: its weights start as the identity on each patch and its negation (so GELU
passes both signs), and `lit_models.PatchWhitening` (a callback) makes it a whitening of the
training images' patches before the first step.
"""

import functools
from collections import OrderedDict

import torch
from torch import nn


class Scale(nn.Module):
    """Multiplies its input by a constant."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def conv3x3(in_channels: int, out_channels: int) -> nn.Conv2d:
    """A 3x3 convolution whose first `in_channels` filters start as the identity: a group starts
    close to passing its input on, which trains faster in few epochs."""
    conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
    with torch.no_grad():
        nn.init.dirac_(conv.weight[:in_channels])
    return conv


def norm(channels: int, bias_lr: float) -> nn.BatchNorm2d:
    """Batch norm with its scale frozen at 1 (the convolution before it sets the scale) and a
    bias that learns `bias_lr` times faster than the weights; running statistics that follow the
    latest batches closely (momentum 0.4): the last weights are the ones evaluated."""
    layer = nn.BatchNorm2d(channels, momentum=0.4)
    layer.weight.requires_grad_(False)
    if bias_lr != 1:
        # Under SGD, a learning rate bias_lr times the optimizer's for the bias, its weight decay
        # unchanged (torch adds the decay after the hooks).
        layer.bias.register_hook(functools.partial(torch.mul, other=bias_lr))
    return layer


def conv_group(in_channels: int, out_channels: int, bias_lr: float) -> nn.Sequential:
    """Two 3x3 convolutions with batch norm and GELU, the resolution halved between them (pooling
    before the norm: the norm sees the pooled statistics, and the second convolution costs a
    quarter)."""
    return nn.Sequential(OrderedDict([
        ("conv1", conv3x3(in_channels, out_channels)), ("pool", nn.MaxPool2d(2)),
        ("norm1", norm(out_channels, bias_lr)), ("act1", nn.GELU()),
        ("conv2", conv3x3(out_channels, out_channels)),
        ("norm2", norm(out_channels, bias_lr)), ("act2", nn.GELU())]))


def patch_identity(channels: int, patch: int) -> torch.Tensor:
    """Convolution weights (2 * C * k * k, C, k, k) that copy each value of a k x k patch to one
    output channel, and its negation to another."""
    size = channels * patch * patch
    eye = torch.eye(size).view(size, channels, patch, patch)
    return torch.cat([eye, -eye])


class WhitenedNet(nn.Sequential):
    """A frozen patch stem and groups of batch-normed convolutions (`--model.net whitened`).

    Args:
        widths: the output channels of each convolution group; their number is the depth (each
            halves the resolution, so 32x32 images take up to four).
        patch: the side of the stem's patches (2: 2x2 patches, 12 values of an RGB image, 24
            channels).
        bias_lr: how many times faster the batch norms' biases learn than the other parameters
            (airbench94's 64: with the norms' scales frozen, the biases are the norms' only
            parameters, and few epochs leave them little time).
    """

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int,
                 widths: list[int] = [64, 256, 256], patch: int = 2, bias_lr: float = 64.0):
        channels, height, width = image_shape
        groups = list(widths)
        if not groups or min(groups) < 1 or patch < 1:
            raise ValueError(f"--model.net.widths {widths} must be one or more positive widths, "
                             f"--model.net.patch {patch} at least 1")
        side = min(height, width) - patch + 1
        if side >> len(groups) < 1:
            raise ValueError(f"{len(groups)} convolution groups need larger images than "
                             f"{height}x{width}: use fewer --model.net.widths")
        stem = nn.Conv2d(channels, 2 * channels * patch * patch, patch)
        with torch.no_grad():
            stem.weight.copy_(patch_identity(channels, patch))
            stem.bias.zero_()
        # Frozen: a whitening is a fixed change of basis; only its bias trains.
        stem.weight.requires_grad_(False)
        layers = [("whiten", stem), ("whiten_act", nn.GELU())]
        for i, (a, b) in enumerate(zip([stem.out_channels, *groups], groups)):
            layers.append((f"group{i + 1}", conv_group(a, b, bias_lr)))
        layers += [("pool", nn.AdaptiveMaxPool2d(1)), ("flatten", nn.Flatten())]
        # Logits scaled down: a temperature that keeps the first steps at a high learning rate
        # from saturating the softmax.
        head = nn.Sequential(OrderedDict([("linear", nn.Linear(groups[-1], num_classes,
                                                               bias=False)),
                                          ("scale", Scale(1 / 9))]))
        super().__init__(OrderedDict([*layers, ("head", head)]))
