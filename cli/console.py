"""What a run prints: warnings a user cannot act on are silenced, narrowly, by their message."""

import os
import warnings

# Lightning's progress bar redraws after every step by default; every 10th looks the same to a reader.
os.environ.setdefault("TQDM_MINITERS", "10")


def quiet_warnings() -> None:
    """Silence the warnings that say nothing a user of this project can act on (each named, by message)."""
    # TensorBoard's graph is traced with torch.jit.trace, which torch now calls deprecated, every run.
    warnings.filterwarnings("ignore", r"`torch\.jit\.trace(_method)?` is deprecated", FutureWarning)
    # Our epoch metrics are reduced over the ranks before they are logged (ImageClassifier._log).
    warnings.filterwarnings("ignore", r".*when logging on epoch level in distributed setting")
