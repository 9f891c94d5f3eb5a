"""Focal loss under FedAvg: down-weighting the well-classified samples.

Lin, Goyal, Girshick, He, Dollar. "Focal Loss for Dense Object Detection." ICCV 2017.

Each client's task loss is the batch mean of ``-(1 - p_y)^gamma * log p_y`` (softmax
probabilities; the multi-class form without the per-class ``alpha``, which the ``cb``
plugin supplies as class-balanced weights). Classification only; aggregation unchanged.
"""

from __future__ import annotations

from fedkit_baselines.imbalance import check_task_loss, focal_per_sample
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2


@hookimpl
def fedkit_options():
    return [Option("gamma", float, 2.0, "focusing parameter gamma (0 = cross-entropy)", min=0.0)]


@hookimpl
def fedkit_check(server):
    return check_task_loss(server, "focal")


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    return focal_per_sample(outputs["logits"], batch.y, client.options()["gamma"]).mean()
