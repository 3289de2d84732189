"""The LightningModule for image classification, the tutorial networks it wraps, and their LR schedules."""

from lit_models.classifier import ImageClassifier
from lit_models.networks import NETWORKS, TutorialCNN, TutorialMLP
from lit_models.schedules import OneCycle

__all__ = ["ImageClassifier", "NETWORKS", "OneCycle", "TutorialCNN", "TutorialMLP"]
