"""Training batches handed to Lightning in chunks of K: one call of the model runs K optimizer steps.

Lightning's training loop costs a fixed ~0.3 ms of Python per step (hooks, progress, logging), about as
much as a whole step of the tutorial networks on a GPU. A chunk of K batches per Lightning step pays it
once per K optimizer steps; `ImageClassifier.training_step` runs them one after another.
"""

import math


class StepChunks:
    """Lists of up to `steps_per_call` consecutive training batches, `num_steps` batches an epoch.

    Wraps the batches of one epoch (`DeviceBatches`, or `LoaderBatches` around a DataLoader) and keeps
    the position in the epoch: the batches handed out so far were trained on by the time Lightning saves
    a checkpoint (it checkpoints between calls), so a resumed run starts at the next batch.
    """

    def __init__(self, batches, steps_per_call: int, num_steps: int):
        self.batches, self.steps_per_call, self.num_steps = batches, steps_per_call, num_steps
        self.epoch = 0
        self.yielded = 0  # batches of the current epoch handed out
        self._resume_at = None  # (epoch, batch), from a checkpoint

    batch_sampler = None

    @property
    def sampler(self):
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches.set_epoch(epoch)

    def __len__(self) -> int:
        return math.ceil(self.num_steps / self.steps_per_call)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.yielded, "steps_per_call": self.steps_per_call}

    def load_state_dict(self, state: dict) -> None:
        self._resume_at = (state["epoch"], state["batch"])

    def __iter__(self):
        start = 0
        if self._resume_at is not None:
            if self._resume_at[0] == self.epoch:
                start = self._resume_at[1]
            self._resume_at = None
        self.yielded = start
        batches = self.batches.iterate(start)
        # Batches already on the device are drawn as the model trains on them (see LazyChunk); a DataLoader's
        # come as lists, which Lightning moves to the device.
        cursor = Cursor(batches, start) if getattr(self.batches, "on_device", False) else None
        while self.yielded < self.num_steps:
            size = min(self.steps_per_call, self.num_steps - self.yielded)
            chunk = LazyChunk(cursor, self.yielded, size) if cursor else [next(batches) for _ in range(size)]
            self.yielded += size
            yield chunk


class Cursor:
    """An epoch's batch iterator and the index of the next batch it gives."""

    def __init__(self, batches, start: int):
        self.batches, self.position = batches, start

    def next(self):
        self.position += 1
        return next(self.batches)


class LazyChunk:
    """Batches `start` to `start + size - 1` of an epoch, each made only when the model comes to train on it.

    A list of K normalised float batches made up front holds K batches' memory where one would do: on a CPU the
    MLP's 8 Fashion-MNIST batches (38 MB) left the cache before their steps used them, and training ran 15%
    slower than with each batch made just before its step. Lightning hands a chunk to the model without
    looking into it (it moves only lists, tuples and the like to the device; these are there already).
    `images` counts the images drawn so far, for the speed figures.
    """

    def __init__(self, cursor: Cursor, start: int, size: int):
        self.cursor, self.start, self.size = cursor, start, size
        self.images = 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        while self.cursor.position < self.start:
            self.cursor.next()  # the batches of an earlier chunk that was not trained to its end (a stop)
        if self.cursor.position != self.start:
            raise RuntimeError(f"batch {self.start} of the epoch was asked for after batch {self.cursor.position}")
        for _ in range(self.size):
            x, y = self.cursor.next()
            self.images += len(y)
            yield x, y
