"""Metrics computed on the server from the clients' prediction arrays or summed statistics."""

from fedkit_core.metrics.classification import classification_metrics
from fedkit_core.metrics.fairness import fairness
from fedkit_core.metrics.segmentation import per_sample_dice, segmentation_metrics
from fedkit_core.metrics.statistics import (
    add_stats,
    classification_stats,
    metrics_from_stats,
    segmentation_stats,
)

__all__ = [
    "add_stats",
    "classification_metrics",
    "classification_stats",
    "fairness",
    "metrics_from_stats",
    "per_sample_dice",
    "segmentation_metrics",
    "segmentation_stats",
]
