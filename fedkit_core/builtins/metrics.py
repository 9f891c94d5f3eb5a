"""The built-in metrics: classification and segmentation scores from prediction arrays."""

from __future__ import annotations

from fedkit_core.hookspecs import hookimpl
from fedkit_core.metrics import classification_metrics, segmentation_metrics


@hookimpl(trylast=True)
def fedkit_metrics(task, arrays):
    if "dice" in arrays:
        return segmentation_metrics(arrays["dice"], task.class_names)
    return classification_metrics(arrays["probs"], arrays["labels"], task.shot_groups)
