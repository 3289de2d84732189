"""The LightningModule for image classification and the tutorial networks it wraps."""

from lit_models.classifier import ImageClassifier
from lit_models.networks import NETWORKS, TutorialCNN, TutorialMLP

__all__ = ["ImageClassifier", "NETWORKS", "TutorialCNN", "TutorialMLP"]
