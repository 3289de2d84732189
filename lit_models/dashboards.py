"""What TensorBoard shows of a run beyond its scalars: test images and confusions, train against
val."""

import itertools

import lightning as L
import torch
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger
from PIL import Image, ImageDraw, ImageFont
from torchvision.transforms.functional import pil_to_tensor, to_pil_image
from torchvision.utils import draw_bounding_boxes, make_grid

from lit_models.classifier import ImageClassifier
from lit_models.tags import class_metrics

# Tags are regular expressions in a Custom Scalars layout: anchored, so that val/acc does not take
# val/acc_best.
LAYOUT = {"train vs val": {
    "loss": ["Multiline", ["^train/loss_step$", "^train/loss_epoch$", "^val/loss$"]],
    "accuracy": ["Multiline", ["^train/acc_step$", "^train/acc_epoch$", "^val/acc$"]]}}
# A test image is enlarged to about TILE pixels; cells are PAD apart.
TILE, PAD = 96, 4
FONT = ImageFont.load_default(size=12)


class Dashboards(L.Callback):
    """TensorBoard's Images, Custom Scalars and Text tabs for a run
    (`--trainer.callbacks+=Dashboards`, one of train.py's default callbacks).

    - At test: `test/predictions`, a grid of test images (the first ones of each test batch, in
      equal shares) framed in green, or red for a mistake, captioned with their true and predicted
      classes, and `test/confusion_matrix` (rows: true classes, columns: predicted; shaded by the
      share of the row), as images at the step the model was trained to. MLflow
      takes them as artifacts `test/*.png`; other loggers skip them.
    - At the start of a run: a Custom Scalars layout (train and val loss on one chart, accuracy on
      another). Nothing runs in a training step.

    Args:
        images: how many test images `test/predictions` shows (0: none).
    """

    def __init__(self, images: int = 32):
        self.images = images
        self.started: set[str] = set()  # the TensorBoard runs whose layout is written
        self.shown: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    # The start of a run: a fit's, or a test's or validation's of a checkpoint (after every
    # callback's setup, where a refused run stops before it writes).
    def on_fit_start(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and logger.log_dir not in self.started:
                self.started.add(logger.log_dir)
                logger.experiment.add_custom_scalars(LAYOUT)

    on_validation_start = on_test_start = on_fit_start

    def on_test_epoch_start(self, trainer, pl_module):
        self.shown = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        # The first process draws the images, for a model of the project's (a user's: its own).
        shows = isinstance(pl_module, ImageClassifier) and trainer.is_global_zero
        wanted = self.wanted(trainer.num_test_batches[dataloader_idx], batch_idx)
        wanted = min(wanted, self.images - sum(len(labels) for _, labels, _ in self.shown))
        if wanted <= 0 or not (shows and image_loggers(trainer)):
            return
        images, labels = batch[0][:wanted], batch[1][:wanted]
        # The weights (averaged ones too, under EMA) and precision of this test step.
        with torch.no_grad(), trainer.precision_plugin.forward_context():
            predicted = pl_module(images).argmax(1)
        self.shown.append((images.cpu(), labels.cpu(), predicted.cpu()))

    def wanted(self, batches: float, batch_idx: int) -> int:
        """This test batch's share of `images`: spread over the test batches, as evenly as they
        come (a test set may be sorted by class); all of them when the batches are not counted."""
        if batches == float("inf"):
            return self.images
        return self.images * (batch_idx + 1) // batches - self.images * batch_idx // batches

    def on_test_epoch_end(self, trainer, pl_module):
        loggers = image_loggers(trainer)
        if not (loggers and isinstance(pl_module, ImageClassifier)):
            return
        # Before the model's own hook resets it; on every process, which a synced compute needs.
        confusion = pl_module.test_confusion.compute().cpu()
        if trainer.is_global_zero:
            names = pl_module.class_names
            name_classes(trainer, names)
            figures = {"test/confusion_matrix": confusion_image(confusion, names)}
            if self.shown:
                images, labels, predicted = (torch.cat(parts) for parts in zip(*self.shown))
                figures["test/predictions"] = prediction_grid(images, labels, predicted, names)
            for (tag, figure), logger in itertools.product(figures.items(), loggers):
                log_image(logger, tag, figure, trainer.global_step)
        self.shown = []


def image_loggers(trainer) -> list:
    kinds = (TensorBoardLogger, MLFlowLogger)
    return [logger for logger in trainer.loggers if isinstance(logger, kinds)]


def name_classes(trainer, names: list[str]) -> None:
    """`test/acc_class` in TensorBoard's Text tab: which class each per-class tag is (a tag holds
    a name made safe, lit_models.tags), tag and name in code spans, which Markdown leaves as they
    are."""
    metrics = class_metrics(names, "test")
    text = "\n".join(f"- `{tag}`: `{name}`" for tag, name in metrics.items())
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text("test/acc_class", text, trainer.global_step)


def log_image(logger, tag: str, image: torch.Tensor, step: int) -> None:
    """A (3, H, W) uint8 image in TensorBoard's Images tab, or as an MLflow artifact."""
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_image(tag, image, step)
    else:
        logger.experiment.log_image(logger.run_id, to_pil_image(image), artifact_file=f"{tag}.png")


def prediction_grid(images: torch.Tensor, labels: torch.Tensor, predicted: torch.Tensor,
                    names: list[str]) -> torch.Tensor:
    """uint8 images (N, C, H, W) in a grid 8 wide, each enlarged by a whole factor to about TILE
    pixels, framed in green (right) or red (a mistake), and captioned `true > predicted`."""
    scale = max(1, TILE // max(images.shape[2:]))
    tiles = rgb(images).repeat_interleave(scale, 2).repeat_interleave(scale, 3)
    box = torch.tensor([[0, 0, tiles.shape[3] - 1, tiles.shape[2] - 1]])
    drawn = [draw_bounding_boxes(tile, box, [f"{names[t]} > {names[p]}"], width=2,
                                 colors="green" if t == p else "red", label_colors="black",
                                 fill_labels=True)
             for tile, t, p in zip(tiles, labels.tolist(), predicted.tolist())]
    return make_grid(drawn, nrow=8, padding=PAD, pad_value=255)


def rgb(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, C, H, W) as (N, 3, H, W): one channel as grey, more cut to three."""
    return images.clamp(0, 255).to(torch.uint8)[:, :3].expand(-1, 3, -1, -1)


def confusion_image(confusion: torch.Tensor, names: list[str]) -> torch.Tensor:
    """A (K, K) confusion matrix of counts (rows: true, columns: predicted) as a heat map with the
    counts, the class names at the rows' left: each cell shaded by its share of the row, so that a
    class's recall is its diagonal's shade."""
    k, cell = len(confusion), max(12, min(40, 640 // len(confusion)))
    share = confusion / confusion.sum(1, keepdim=True).clamp(min=1)
    shades = 255 + (torch.tensor([31, 91, 180]).view(3, 1, 1) - 255) * share
    margin = int(max(FONT.getlength(name) for name in names)) + 2 * PAD
    image = Image.new("RGB", (margin + k * cell, k * cell), "white")
    cells = to_pil_image(shades.byte()).resize((k * cell, k * cell), Image.NEAREST)
    image.paste(cells, (margin, 0))
    draw = ImageDraw.Draw(image)
    for r, c in itertools.product(range(k), range(k)):
        ink = "white" if share[r, c] > 0.5 else "black"
        centre = (margin + c * cell + cell // 2, r * cell + cell // 2)
        draw.text(centre, str(int(confusion[r, c])), anchor="mm", fill=ink, font=FONT)
        draw.text((margin - PAD, centre[1]), names[r], anchor="rm", fill="black", font=FONT)
    return pil_to_tensor(image)
