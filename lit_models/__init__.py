"""The LightningModule for image classification, the networks it wraps, and its schedule and
callbacks."""

from lit_models.callbacks import EMA, LastCheckpoint, RunRecord, TrainingSpeed
from lit_models.classifier import ImageClassifier, ModelError
from lit_models.dashboards import Dashboards
from lit_models.networks import NETWORKS, TutorialCNN, TutorialMLP
from lit_models.schedules import OneCycle
from lit_models.whitened_net import WhitenedNet
from lit_models.whitening import PatchWhitening

__all__ = ["Dashboards", "EMA", "ImageClassifier", "LastCheckpoint", "ModelError", "NETWORKS",
           "OneCycle", "PatchWhitening", "RunRecord", "TrainingSpeed", "TutorialCNN", "TutorialMLP",
           "WhitenedNet"]
