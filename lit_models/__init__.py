"""The LightningModule for image classification, the tutorial networks it wraps, and its schedule
and callbacks."""

from lit_models.callbacks import EMA, LastCheckpoint, TimedProgressBar, TrainingSpeed
from lit_models.classifier import ImageClassifier, ModelError
from lit_models.dashboards import Dashboards
from lit_models.networks import NETWORKS, TutorialCNN, TutorialMLP
from lit_models.schedules import OneCycle

__all__ = [
    "Dashboards",
    "EMA",
    "ImageClassifier",
    "LastCheckpoint",
    "ModelError",
    "NETWORKS",
    "OneCycle",
    "TimedProgressBar",
    "TrainingSpeed",
    "TutorialCNN",
    "TutorialMLP",
]
