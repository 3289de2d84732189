"""From images as they come (PIL images, uint8 tensors) to what a network takes: the model's own preprocessing.

Training batches are normalised by the data module on the device, in the same arithmetic; this is the
preprocessing a trained model carries with it, for `classify`, `predict` and exported models.
"""

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import nn
from torch.utils.data import Dataset


class Uint8Normalize(nn.Module):
    """uint8 images (N, C, H, W) in 0..255 to floats normalised per channel: (x / 255 - mean) / std.

    One multiply-add per element, as the data module's device batches do it.
    """

    def __init__(self, mean: list[float], std: list[float]):
        super().__init__()
        mean_t, std_t = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
        # Not persistent: the statistics are hyperparameters of the model, rebuilt from them on loading.
        self.register_buffer("scale", (1.0 / (255.0 * std_t)).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("shift", (-mean_t / std_t).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.float() * self.scale + self.shift


def fit_image(image: Image.Image, image_shape: tuple[int, int, int]) -> np.ndarray:
    """A PIL image as a uint8 array (C, H, W) of `image_shape`: converted to grey (C = 1) or RGB (C = 3),
    and, when its size differs, scaled to cover H x W and centre-cropped (torchvision's Resize + CenterCrop)."""
    channels, height, width = image_shape
    mode = "L" if channels == 1 else "RGB"
    if image.mode != mode:  # convert() to the same mode only copies: 5% of the time of a CIFAR-10 JPEG
        image = image.convert(mode)
    if image.size != (width, height):
        image = ImageOps.fit(image, (width, height), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8).reshape(height, width, channels).transpose(2, 0, 1)


def to_uint8_batch(images, image_shape: tuple[int, int, int]) -> torch.Tensor:
    """A uint8 batch (N, C, H, W) from a uint8 tensor (N, C, H, W) or (C, H, W), a PIL image or a list of them."""
    if isinstance(images, Image.Image):
        images = [images]
    if isinstance(images, (list, tuple)):
        images = torch.stack([torch.from_numpy(fit_image(image, image_shape).copy()) if isinstance(image, Image.Image)
                              else torch.as_tensor(image) for image in images])
    if images.dtype != torch.uint8:
        raise TypeError(f"classify takes uint8 images (0..255) or PIL images, not {images.dtype} tensors")
    if images.dim() == 3:
        images = images.unsqueeze(0)
    if tuple(images.shape[1:]) != tuple(image_shape):
        raise ValueError(f"this model takes images of shape {tuple(image_shape)} (C, H, W), not "
                         f"{tuple(images.shape[1:])}; pass PIL images to have them converted")
    return images


class ImageFiles(Dataset):
    """Image files as the model's uint8 input (C, H, W), through `fit_image`, for a DataLoader's worker processes.

    An item is `(image, error)`: a file that cannot be read gives a blank image and the reason, so that one
    broken file among thousands does not stop the others; the caller skips and reports it. `collate` makes a
    batch `(images, {index in the batch: error})`.
    """

    def __init__(self, paths: list[Path], image_shape: tuple[int, int, int]):
        self.paths, self.image_shape = list(paths), tuple(image_shape)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        try:
            with Image.open(self.paths[i]) as image:
                array = fit_image(image, self.image_shape)
        except Exception as e:  # PIL reports broken files as OSError, SyntaxError, ValueError, zlib errors...
            return torch.zeros(self.image_shape, dtype=torch.uint8), f"{type(e).__name__}: {e}"
        return torch.from_numpy(array.copy()), ""  # PIL's array is read-only

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, str]]) -> tuple[torch.Tensor, dict[int, str]]:
        """A batch of items, its errors as a dict of the few that failed: Lightning moves a batch to the device
        by walking it, and a tuple of a string per image cost more than the network's normalisation."""
        return torch.stack([image for image, _ in items]), {i: error for i, (_, error) in enumerate(items) if error}
