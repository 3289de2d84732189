"""What Lightning and torch print in a train.py run that its user can do nothing about, silenced
one message at a time, each with the reason it says nothing to them."""

import logging
import warnings

# Warnings, by the start of their message.
WARNINGS = [
    # torch deprecates a use inside Lightning's own code (lightning/pytorch/utilities/_pytree.py).
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # test, validate, predict and export load a checkpoint's weights alone; a resumed fit's
    # callbacks are its run's own (its config.yaml).
    r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
    # The prediction writer (lit_models/predict.py) names its rows itself: no batch indices needed.
    r"Couldn't infer the batch indices fetched from your dataloader",
    # A resumed run goes on in its own folder, beside its own checkpoints; a new run is given a
    # new folder, and refused one that holds another run (runs.SaveConfig).
    r"Checkpoint directory .* exists and is not empty",
    # `--data.val_size 0` asks for no validation: the data modules' val_dataloader is then [].
    r"Total length of `list` across ranks is zero",
]
# ImageClassifier logs its training metrics at each epoch's end too: a short epoch loses none.
SHORT_EPOCH = r"The number of training batches \(\d+\) is smaller than the logging interval"


class NoTips(logging.Filter):
    """Lightning's advertisements for its cloud services, which this project does not use."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def silence(warnings_list: list[str] = WARNINGS) -> None:
    """Silence these warnings, and Lightning's tips. Called again, it changes nothing: a filter
    already there is not added twice."""
    for message in warnings_list:
        warnings.filterwarnings("ignore", message=message)  # replaces the same filter
    for package in ("pytorch", "fabric"):
        logger = logging.getLogger(f"lightning.{package}.utilities.rank_zero")
        if not any(isinstance(f, NoTips) for f in logger.filters):
            logger.addFilter(NoTips())
