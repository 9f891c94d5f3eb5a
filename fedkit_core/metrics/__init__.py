"""Metrics computed on the server from the clients' prediction arrays."""

from fedkit_core.metrics.classification import classification_metrics
from fedkit_core.metrics.fairness import fairness
from fedkit_core.metrics.segmentation import per_sample_dice, segmentation_metrics

__all__ = ["classification_metrics", "fairness", "per_sample_dice", "segmentation_metrics"]
