"""What TensorBoard shows of a run beyond its scalars: test images and confusions, train against
val."""

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger
from PIL import Image, ImageDraw, ImageFont

from lit_models.classifier import ImageClassifier
from lit_models.tags import class_metrics

# Tags are regular expressions in a Custom Scalars layout: anchored, so that val/acc does not take
# val/acc_best.
LAYOUT = {
    "train vs val": {
        "loss": ["Multiline", ["^train/loss_step$", "^train/loss_epoch$", "^val/loss$"]],
        "accuracy": ["Multiline", ["^train/acc_step$", "^train/acc_epoch$", "^val/acc$"]],
    },
}
# A test image is enlarged to about TILE pixels, with two lines of LINE under it.
TILE, LINE, PAD = 96, 14, 4
GREEN, RED, GREY = (0, 120, 0), (200, 0, 0), (90, 90, 90)
FONT = ImageFont.load_default(size=LINE - 2)


class Dashboards(L.Callback):
    """TensorBoard's Images, Custom Scalars and Text tabs for a run
    (`--trainer.callbacks+=Dashboards`, one of train.py's default callbacks).

    - At test: `test/predictions`, a grid of test images (the first ones of each test batch, in
      equal shares) with their true class (grey) and the predicted one (green, or red in a red
      frame for a mistake), and `test/confusion_matrix` (rows: true classes, columns: predicted;
      shaded by the share of the row), as images at the step the model was trained to. MLflow
      takes them as artifacts `test/*.png`; other loggers skip them.
    - At the start of a run: a Custom Scalars layout (train and val loss on one chart, accuracy on
      another). Nothing runs in a training step.

    Args:
        images: how many test images `test/predictions` shows (0: none).
    """

    def __init__(self, images: int = 32):
        self.images = images
        # The TensorBoard runs whose layout and settings are written.
        self.started: set[str] = set()
        self.shown: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    # The start of a run: a fit's, or a test's or validation's of a checkpoint.
    def setup(self, trainer, pl_module, stage):
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and logger.log_dir not in self.started:
                self.started.add(logger.log_dir)
                logger.experiment.add_custom_scalars(LAYOUT)

    def on_test_epoch_start(self, trainer, pl_module):
        self.shown = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not isinstance(pl_module, ImageClassifier):  # a model of the user's: its own images
            return
        wanted = self.wanted(trainer.num_test_batches[dataloader_idx], batch_idx)
        wanted = min(wanted, self.images - sum(len(labels) for _, labels, _ in self.shown))
        if wanted <= 0 or not shows_images(trainer):
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
        classifier = isinstance(pl_module, ImageClassifier)
        confusion = None
        if loggers and classifier:
            # Before the model's own hook resets it; on every process, which a synced compute
            # needs.
            confusion = pl_module.test_confusion.compute()
        if not trainer.is_global_zero or not loggers:
            return
        names = None
        if classifier:
            names = pl_module.class_names
            name_classes(trainer, names)
        for tag, figure in self.figures(confusion, names).items():
            for logger in loggers:
                log_image(logger, tag, figure, trainer.global_step)
        self.shown = []

    def figures(self, confusion: torch.Tensor | None, names: list[str] | None) -> dict:
        """`test/predictions` of the images shown, and `test/confusion_matrix`, by tag."""
        figures = {}
        if self.shown:
            images, labels, predicted = (torch.cat(parts) for parts in zip(*self.shown))
            largest = int(max(labels.max(), predicted.max()))
            names = names or [str(k) for k in range(largest + 1)]
            figures["test/predictions"] = prediction_grid(images, labels, predicted, names)
        if confusion is not None:
            figures["test/confusion_matrix"] = confusion_image(confusion.cpu(), names)
        return figures


def image_loggers(trainer) -> list:
    kinds = (TensorBoardLogger, MLFlowLogger)
    return [logger for logger in trainer.loggers if isinstance(logger, kinds)]


def shows_images(trainer) -> bool:
    """The process that draws the test images: the first, with a logger that takes images."""
    return trainer.is_global_zero and bool(image_loggers(trainer))


def name_classes(trainer, names: list[str]) -> None:
    """`test/acc_class` in TensorBoard's Text tab: which class each per-class tag is (a tag holds
    a name made safe, lit_models.tags), tag and name in code spans, which Markdown leaves as they
    are."""
    metrics = class_metrics(names, "test")
    text = "\n".join(f"- `{tag}`: `{name}`" for tag, name in metrics.items())
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text("test/acc_class", text, trainer.global_step)


def log_image(logger, tag: str, image: Image.Image, step: int) -> None:
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_image(tag, np.asarray(image), step, dataformats="HWC")
    else:
        logger.experiment.log_image(logger.run_id, image, artifact_file=f"{tag}.png")


def fit_text(draw: ImageDraw.ImageDraw, text: str, width: int) -> str:
    while text and draw.textlength(text, font=FONT) > width:
        text = text[:-1]
    return text


def prediction_grid(images: torch.Tensor, labels: torch.Tensor, predicted: torch.Tensor,
                    names: list[str], columns: int = 8) -> Image.Image:
    """uint8 images (N, C, H, W) in a grid of `columns`, each enlarged by a whole factor to about
    TILE pixels (at least TILE wide), its true class under it and the predicted one (green, or red
    and framed in red: a mistake)."""
    n, _, height, width = images.shape
    scale = max(1, TILE // max(height, width))
    cell_w = max(TILE, width * scale) + 2 * PAD
    cell_h = height * scale + 2 * LINE + 3 * PAD
    rows = -(-n // columns)
    grid = Image.new("RGB", (min(n, columns) * cell_w, rows * cell_h), "white")
    draw = ImageDraw.Draw(grid)
    pixels = rgb(images)
    for i in range(n):
        x, y = (i % columns) * cell_w, (i // columns) * cell_h
        tile = Image.fromarray(np.ascontiguousarray(pixels[i].numpy()))
        tile = tile.resize((width * scale, height * scale), Image.NEAREST)
        left = x + (cell_w - tile.width) // 2
        grid.paste(tile, (left, y + PAD))
        verdict = GREEN
        if labels[i] != predicted[i]:
            verdict = RED
            frame = (left - 2, y + PAD - 2, left + tile.width + 1, y + PAD + tile.height + 1)
            draw.rectangle(frame, outline=RED, width=2)
        captions = ((names[labels[i]], GREY), (names[predicted[i]], verdict))
        for line, (text, colour) in enumerate(captions):
            position = (x + PAD, y + 2 * PAD + tile.height + line * LINE)
            draw.text(position, fit_text(draw, text, cell_w - 2 * PAD), fill=colour, font=FONT)
    return grid


def rgb(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, C, H, W) as (N, H, W, 3) pixels: one channel as grey, more cut to three."""
    pixels = images.clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    if images.shape[1] == 1:
        return pixels.expand(-1, -1, -1, 3)
    return pixels[..., :3]


def confusion_image(confusion: torch.Tensor, names: list[str], cell: int = 40) -> Image.Image:
    """A (K, K) confusion matrix of counts (rows: true, columns: predicted) as a heat map with the
    counts and the class names: each cell shaded by its share of the row, so that a class's recall
    is its diagonal's shade."""
    k = len(confusion)
    cell = max(12, min(cell, 640 // k))
    margin = int(max(FONT.getlength(name) for name in names)) + 3 * PAD + LINE
    image = Image.new("RGB", (margin + k * cell + PAD, margin + k * cell + PAD), "white")
    draw = ImageDraw.Draw(image)
    share = (confusion / confusion.sum(1, keepdim=True).clamp(min=1)).numpy()
    for r in range(k):
        for c in range(k):
            shade = tuple(int(255 + (t - 255) * share[r, c]) for t in (31, 91, 180))
            top, left = margin + r * cell, margin + c * cell
            box = (left, top, left + cell - 1, top + cell - 1)
            draw.rectangle(box, fill=shade)
            if cell >= 24:
                centre = (left + cell // 2, top + cell // 2)
                ink = "white" if share[r, c] > 0.5 else "black"
                draw.text(centre, str(int(confusion[r, c])), anchor="mm", fill=ink, font=FONT)
        row_name_at = (margin - PAD, margin + r * cell + cell // 2)
        draw.text(row_name_at, names[r], anchor="rm", fill="black", font=FONT)
    # Column names read upwards: drawn in a strip that is then turned a quarter to the left.
    strip = Image.new("RGB", (margin - LINE, k * cell), "white")
    strip_draw = ImageDraw.Draw(strip)
    for c in range(k):
        strip_draw.text((PAD, c * cell + cell // 2), names[c], anchor="lm", fill="black", font=FONT)
    image.paste(strip.rotate(90, expand=True), (margin, LINE))
    draw.text((PAD, PAD), "true \\ predicted", fill=GREY, font=FONT)
    return image
