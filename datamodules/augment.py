"""Augmentations of a whole uint8 batch where it lies (CPU or GPU): a few batched tensor ops, each
image drawn its own way from one generator, no host sync; and the seeds they are drawn from."""

import torch
import torch.nn.functional as F


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator,
                reflect: bool = False) -> torch.Tensor:
    """torchvision's RandomCrop(size, padding, padding_mode="constant" or "reflect") for a whole
    batch: each image at its own random offset, in two gathers (no Python loop, no boolean
    indexing: no host sync on a GPU). Reflected, the gathers read the image's own rows and
    columns mirrored at its borders (no padded copy)."""
    n, c, h, w = images.shape
    offsets = torch.randint(0, 2 * padding + 1, (2, n, 1), device=images.device,
                            generator=generator)
    rows = torch.arange(h, device=images.device) + offsets[0]
    cols = torch.arange(w, device=images.device) + offsets[1]
    if reflect:
        rows, cols = reflected(rows - padding, h), reflected(cols - padding, w)
    else:
        images = F.pad(images, (padding, padding, padding, padding))
    rows, cols = rows[:, None, :, None], cols[:, None, None, :]
    images = images.gather(2, rows.expand(n, c, h, images.shape[3]))
    return images.gather(3, cols.expand(n, c, h, w))


def reflected(index: torch.Tensor, size: int) -> torch.Tensor:
    """Indices from -(size - 1) to 2 (size - 1) mirrored into 0..size-1 at the borders, the
    border itself not repeated (F.pad's "reflect": -1 -> 1, size -> size - 2)."""
    last = size - 1
    return last - (last - index.abs()).abs()


def random_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image of a batch left-right with probability 1/2."""
    flip = torch.rand(len(images), 1, 1, 1, device=images.device, generator=generator) < 0.5
    return torch.where(flip, images.flip(3), images)


def mix_seed(*values: int) -> int:
    """One 63-bit seed from several integers, for torch.Generator.manual_seed: Python's hash of
    their tuple, which is the same in every process (ints are not salted), takes any integers
    without overflow, and sets neighbours well apart (seed 1 at step 0 and seed 0 at step 1 give
    unrelated streams, where a sum would give the same one)."""
    return hash(values) & ((1 << 63) - 1)
