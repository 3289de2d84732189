"""Batches cut from a whole data set that already lives on the training device.

The tutorials feed the GPU through a DataLoader that decodes, converts and normalises one image at a
time in Python worker processes; at their batch sizes the device mostly waits. Here the data set is a
uint8 tensor on the device: a batch is one index gather, and cropping, flipping and normalising are a
handful of batched tensor ops on the device (the recipe of KellerJordan/cifar10-airbench).
"""

import torch
import torch.nn.functional as F

_MASK64 = (1 << 64) - 1


def mix_seed(*values: int) -> int:
    """One 63-bit seed from several integers (splitmix64), for torch.Generator.manual_seed.

    Any seeds (up to 2^64) and epoch and batch numbers, without overflow, and well apart for neighbours.
    """
    state = 0
    for value in values:
        state = (state + (value & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Crop each image of a batch at a random offset after zero-padding it by `padding` pixels.

    What torchvision's `RandomCrop(size, padding)` does per image, for a whole batch in two gathers:
    no Python loop and no boolean-mask indexing, so no host sync on a GPU.
    """
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (2, n, 1), device=images.device, generator=generator)
    rows = (torch.arange(h, device=images.device) + offsets[0])[:, None, :, None]
    padded = padded.gather(2, rows.expand(n, c, h, w + 2 * padding))
    cols = (torch.arange(w, device=images.device) + offsets[1])[:, None, None, :]
    return padded.gather(3, cols.expand(n, c, h, w))


def random_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image of a batch left-right with probability 1/2."""
    flip = torch.rand(len(images), 1, 1, 1, device=images.device, generator=generator) < 0.5
    return torch.where(flip, images.flip(3), images)


class DeviceBatches:
    """An iterable of normalised `(images, labels)` batches from uint8 tensors on one device.

    Each `iter()` is a fresh epoch. With `shuffle`, the order of epoch e is a function of `(seed, e)`
    and the augmentation of its batch i of `(seed, e, i, rank)`: Lightning announces the epoch through
    `sampler.set_epoch(e)`, the protocol of `DistributedSampler`, and `iterate(start)` begins an epoch
    at any batch, so a resumed run sees exactly the batches it would have seen.

    Under DDP, rank r of w takes every w-th sample of the shared permutation, cut to the same length on
    every rank, so that all ranks run the same number of steps. Without `shuffle` (evaluation), the
    ranks take disjoint contiguous parts and every sample is seen exactly once across them.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, mean: torch.Tensor,
                 std: torch.Tensor, *, shuffle: bool = False, crop_padding: int = 0, flip: bool = False,
                 seed: int = 0, rank: int = 0, world_size: int = 1):
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle = batch_size, shuffle
        self.crop_padding, self.flip = crop_padding, flip
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        # One multiply-add per element turns 0..255 into normalised floats.
        self.scale = (1.0 / (255.0 * std)).view(1, -1, 1, 1).to(images.device)
        self.shift = (-mean / std).view(1, -1, 1, 1).to(images.device)
        if shuffle:
            self.num_samples = len(images) // world_size
            self.num_batches = self.num_samples // batch_size  # full batches only
        else:
            self.eval_indices = torch.arange(len(images), device=images.device).tensor_split(world_size)[rank]
            self.num_samples = len(self.eval_indices)
            self.num_batches = -(-self.num_samples // batch_size)

    # Lightning duck-types loaders: it calls `loader.sampler.set_epoch(e)` and reads `batch_sampler`.
    batch_sampler = None
    on_device = True  # the batches are made where the model is: StepChunks draws them lazily

    @property
    def sampler(self):
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        return self.iterate(0)

    def iterate(self, start: int):
        """The batches of the current epoch from batch `start` on."""
        device = self.images.device
        generator = torch.Generator(device=device)
        if self.shuffle:
            generator.manual_seed(mix_seed(self.seed, self.epoch))
            order = torch.randperm(len(self.images), device=device, generator=generator)
            order = order[self.rank::self.world_size][: self.num_samples]
        else:
            order = self.eval_indices
        for i in range(start, self.num_batches):
            index = order[i * self.batch_size:(i + 1) * self.batch_size]
            # index_select, not images[index]: on a CPU, advanced indexing of a uint8 tensor took 330 µs
            # for an MLP batch (5% of its step), index_select 20 µs. Same result.
            images = self.images.index_select(0, index)
            if self.crop_padding or self.flip:
                # Seeded per batch, so that a resumed epoch need not replay the batches before it.
                generator.manual_seed(mix_seed(self.seed, self.epoch, i, self.rank))
            if self.crop_padding:
                images = random_crop(images, self.crop_padding, generator)
            if self.flip:
                images = random_flip(images, generator)
            yield images.float().mul_(self.scale).add_(self.shift), self.labels.index_select(0, index)
