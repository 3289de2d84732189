"""The classic path (`--data.on_device false`): a DataLoader with worker processes, for data sets that do
not fit on the device. Same batches, epoch after epoch and after a resume, as a run that was never stopped.

torchvision's random transforms draw from each worker's global generator, so the crops a sample gets
depend on which worker loaded it and on what that worker loaded before, and a resumed run sees others.
Here each training sample is cropped and flipped with a generator seeded by (seed, epoch, sample): the
same pixels whatever the number of workers, and a resumed epoch starts at any batch.
"""

import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.device_batches import mix_seed, random_crop, random_flip


class SeededImages(Dataset):
    """uint8 images (N, C, H, W) and labels; an item is normalised, and augmented when asked for by
    `(epoch, index)` (training) rather than `index` (evaluation)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 crop_padding: int = 0, flip: bool = False, seed: int = 0):
        self.images, self.labels = images, labels
        self.scale = (1.0 / (255.0 * std)).view(-1, 1, 1)
        self.shift = (-mean / std).view(-1, 1, 1)
        self.crop_padding, self.flip, self.seed = crop_padding, flip, seed

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, key):
        epoch, i = key if isinstance(key, tuple) else (None, key)
        image = self.images[i]
        if epoch is not None and (self.crop_padding or self.flip):
            generator = torch.Generator().manual_seed(mix_seed(self.seed, epoch, i))
            if self.crop_padding:
                image = random_crop(image[None], self.crop_padding, generator)[0]
            if self.flip:
                image = random_flip(image[None], generator)[0]
        return image.float() * self.scale + self.shift, self.labels[i]


class EpochSampler(Sampler):
    """The training order of one rank: a seeded permutation per epoch, every `world_size`-th sample of it,
    cut to whole batches; yields `(epoch, index)` from batch `start` on."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        self.n, self.batch_size, self.seed, self.rank, self.world_size = n, batch_size, seed, rank, world_size
        self.num_samples = (n // world_size) // batch_size * batch_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples - self.start * self.batch_size

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(mix_seed(self.seed, self.epoch)))
        order = order[self.rank::self.world_size][: self.num_samples][self.start * self.batch_size:]
        return ((self.epoch, i) for i in order.tolist())


class LoaderBatches:
    """Training batches from a DataLoader over `SeededImages`, in the `iterate(start)` protocol of
    `DeviceBatches`."""

    def __init__(self, dataset: SeededImages, batch_size: int, seed: int, rank: int, world_size: int,
                 num_workers: int, pin_memory: bool):
        self.sampler = EpochSampler(len(dataset), batch_size, seed, rank, world_size)
        self.num_batches = self.sampler.num_samples // batch_size
        self.loader = DataLoader(dataset, batch_size, sampler=self.sampler, num_workers=num_workers,
                                 persistent_workers=num_workers > 0, pin_memory=pin_memory)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return self.num_batches

    def iterate(self, start: int):
        self.sampler.start = start
        return iter(self.loader)


def evaluation_loader(dataset: SeededImages, batch_size: int, rank: int, world_size: int, num_workers: int,
                      pin_memory: bool) -> DataLoader:
    """Every sample exactly once across the ranks, in order (unlike DistributedSampler, which pads with repeats)."""
    sampler = UnrepeatedDistributedSampler(dataset, world_size, rank, shuffle=False)
    return DataLoader(dataset, batch_size, sampler=sampler, num_workers=num_workers,
                      persistent_workers=num_workers > 0, pin_memory=pin_memory)
