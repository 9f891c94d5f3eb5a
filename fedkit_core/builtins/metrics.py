"""The built-in metrics: classification and segmentation scores from prediction arrays
(``evaluation=pooled``) or from the clients' sufficient statistics (``federated``)."""

from __future__ import annotations

from fedkit_core.hooks.hookspecs import hookimpl
from fedkit_core.metrics import classification_metrics, segmentation_metrics
from fedkit_core.metrics.statistics import metrics_from_stats


@hookimpl(trylast=True)
def fedkit_metrics(server, arrays):
    task = server.task
    if "confusion" in arrays or "dice_sum" in arrays:  # evaluation=federated
        return metrics_from_stats(arrays, task.shot_groups, task.class_names)
    if "dice" in arrays:
        return segmentation_metrics(arrays["dice"], task.class_names)
    return classification_metrics(arrays["probs"], arrays["labels"], task.shot_groups)
