"""A stand-in data module for a trained model whose data is not at hand (`train.py predict --inputs`)."""

from datamodules.base import ImageDataModule


class CheckpointData(ImageDataModule):
    """What a checkpoint knows about the data it was trained on, without the data (`predict --inputs`).

    The CLI links the model's image shape, classes and normalisation from the data module. Predicting files
    needs no training data, so this stands in for the run's data module and answers those links from the
    checkpoint: a model trained on an image folder that has since moved still predicts. It holds no images.
    """

    name = "checkpoint"

    def __init__(self, image_shape: tuple[int, int, int] = (3, 32, 32), classes: list[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        self._image_shape = tuple(image_shape)
        self.classes = list(classes or [])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self._image_shape

    def prepare_data(self):
        pass

    def setup(self, stage: str | None = None):
        pass
