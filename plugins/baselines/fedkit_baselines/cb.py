"""Class-balanced loss: each sample weighted by the inverse effective number of its class.

Cui, Jia, Lin, Song, Belongie. "Class-Balanced Loss Based on Effective Number of Samples."
CVPR 2019.

Each client weights its samples by ``(1 - beta) / (1 - beta^n_y)`` with ``n_y`` its own
training count of the sample's class (never sent), normalised to sum to the number of classes
it has (the paper normalises over all classes; a class absent locally has no finite weight and
is never a local target). The loss is the batch mean of weight times softmax cross-entropy or
focal loss (the paper's softmax and focal variants). Classification only; aggregation
unchanged.
"""

from __future__ import annotations

from fedkit_baselines.imbalance import (
    check_task_loss,
    class_balanced_weights,
    counts,
    focal_per_sample,
)
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2


@hookimpl
def fedkit_options():
    return [
        Option(
            "beta",
            float,
            0.9999,
            "beta of the effective number (1 - beta^n)/(1 - beta)",
            min=0.0,
            lt=1,
        ),
        Option(
            "base", str, "ce", "the weighted loss: ce (softmax) or focal", choices=("ce", "focal")
        ),
        Option("gamma", float, 2.0, "focal loss gamma (with base=focal)", min=0.0),
    ]


@hookimpl
def fedkit_check(server):
    return check_task_loss(server, "cb")


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    opts = client.options()
    gamma = opts["gamma"] if opts["base"] == "focal" else 0.0
    weights = class_balanced_weights(counts(client), opts["beta"])
    return (weights[batch.y] * focal_per_sample(outputs["logits"], batch.y, gamma)).mean()
