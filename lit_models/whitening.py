"""A convolution made a whitening of the training images' patches, before the first step of a fit
(`--trainer.callbacks+=PatchWhitening`): the fast CIFAR-10 trainers' first layer."""

import math
from typing import Optional

import lightning as L
import torch
import torch.nn.functional as F

from lit_models.checks import ModelError


class PatchWhitening(L.Callback):
    """Sets the weights of a convolution so that its outputs are the principal components of the
    patches it sees, each scaled to unit variance, and freezes them: the layer decorrelates its
    input, which the layers after it then learn from in fewer steps.

    At the start of a fit that does not resume from a checkpoint, the model runs (in eval mode, no
    gradients) on the first `images` training images as the training loader gives them, and the
    layer's input is collected there: whatever the model does to its images before it (its
    normalisation), the whitening is of what the layer receives. Filter i of the first half is
    the i-th component over sqrt(its variance + eps), the second half the same negated (so that
    an activation after it keeps both signs); the bias centres the outputs. The weights are the
    layer's own, so checkpoints, exports and a resumed fit carry them, and a resume does not
    compute them again. Under DDP the first process's are broadcast to all.

    Args:
        layer: the convolution's name in the LightningModule (`net.whiten`, as `named_modules`
            names it); None: the first Conv2d.
        images: how many training images to estimate the patches' statistics from (at least one
            batch is used).
        eps: added to each variance: keeps directions of almost no variance (noise, compression
            artefacts) from being amplified without bound.
    """

    def __init__(self, layer: Optional[str] = None, images: int = 2000, eps: float = 5e-4):
        if images < 1 or not eps > 0:
            raise ModelError(f"PatchWhitening needs images >= 1 (not {images}) and eps > 0 (not "
                             f"{eps})")
        self.layer, self.images, self.eps = layer, images, eps

    def find(self, model: torch.nn.Module) -> torch.nn.Conv2d:
        """The convolution to whiten; a ModelError if there is none, or it cannot be one."""
        modules = dict(model.named_modules())
        convs = [name for name, m in modules.items() if isinstance(m, torch.nn.Conv2d)]
        name = self.layer or next(iter(convs), None)
        if name not in convs:
            raise ModelError(f"PatchWhitening: {self.layer or 'a Conv2d'} is not a convolution "
                             f"of the model (its convolutions: {', '.join(convs) or 'none'})")
        conv = modules[name]
        directions = math.prod(conv.weight.shape[1:])
        if conv.groups != 1 or math.ceil(conv.out_channels / 2) > directions:
            raise ModelError(f"PatchWhitening: {name} ({conv.out_channels} channels, groups "
                             f"{conv.groups}) must be an ungrouped convolution of at most twice "
                             f"as many channels as its patches have values ({directions})")
        return conv

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        conv = self.find(pl_module)
        # Frozen after a resume too: requires_grad is not in a checkpoint.
        conv.weight.requires_grad_(False)
        if trainer.ckpt_path is not None:  # the checkpoint's whitening, as it trained
            return
        mean, covariance = patch_moments(trainer, pl_module, conv, self.images)
        weight, bias = whitening(mean, covariance, conv, self.eps)
        weight, bias = trainer.strategy.broadcast((weight, bias), src=0)
        with torch.no_grad():
            conv.weight.copy_(weight)
            if conv.bias is not None:
                conv.bias.copy_(bias)


def patch_moments(trainer: L.Trainer, model: L.LightningModule, conv: torch.nn.Conv2d,
                  images: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean (D,) and covariance (D, D), in float64 on the host, of the D-value patches that
    `conv` takes from its input while `model` runs on the first `images` training images."""
    sums = {"count": 0, "sum": 0.0, "outer": 0.0}

    def collect(module, args):
        patches = F.unfold(args[0].float(), conv.kernel_size, conv.dilation, conv.padding,
                           conv.stride)  # (N, D, positions)
        values = patches.transpose(1, 2).reshape(-1, patches.shape[1]).double()
        sums["count"] += len(values)
        sums["sum"] = sums["sum"] + values.sum(0)
        sums["outer"] = sums["outer"] + values.T @ values

    hook = conv.register_forward_pre_hook(collect)
    was_training = model.training
    model.eval()
    seen = 0
    try:
        with torch.no_grad():
            for batch in trainer.train_dataloader:
                inputs = batch[0] if isinstance(batch, (list, tuple)) else batch
                model(inputs[:images - seen])
                seen += len(inputs[:images - seen])
                if seen >= images:
                    break
    finally:
        hook.remove()
        model.train(was_training)
    mean = sums["sum"].cpu() / sums["count"]
    covariance = sums["outer"].cpu() / sums["count"] - torch.outer(mean, mean)
    return mean, covariance


def whitening(mean: torch.Tensor, covariance: torch.Tensor, conv: torch.nn.Conv2d,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights and bias of `conv` that whiten patches of this mean and covariance: the
    leading principal components over sqrt(variance + eps), then the same negated."""
    variances, vectors = torch.linalg.eigh(covariance)  # ascending
    n = math.ceil(conv.out_channels / 2)
    variances, vectors = variances.flip(0)[:n], vectors.flip(1)[:, :n]
    filters = vectors.T / (variances.clamp(min=0) + eps).sqrt()[:, None]
    filters = torch.cat([filters, -filters])[:conv.out_channels]
    bias = -filters @ mean
    weight = filters.view(conv.weight.shape).to(conv.weight)
    return weight, bias.to(conv.weight)
