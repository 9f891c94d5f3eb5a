"""LDAM-DRW: label-distribution-aware margins, then deferred class re-weighting.

Cao, Wei, Gaidon, Arechiga, Ma. "Learning Imbalanced Datasets with Label-Distribution-Aware
Margin Loss." NeurIPS 2019 (code: kaidic/LDAM-DRW).

Each client's loss is ``CE(s * (cos - Delta_y))``: the classifier is the authors' normalised
(cosine) linear layer scaled by ``s`` (``use_norm`` in their code, which LDAM uses), and the
target class's logit is lowered by a margin ``Delta_c = C / n_c^(1/4)``, with ``n_c`` the
client's own training count and ``C`` set so the largest margin is ``max_margin``. From round
``drw_round`` on (deferred re-weighting), the cross-entropy is weighted per class by the
inverse effective number ``(1 - beta) / (1 - beta^n_c)`` (the authors' DRW). The model keeps
the scaled cosine head for evaluation. Classification only; aggregation unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedkit_baselines.imbalance import check_task_loss, class_balanced_weights, counts
from fedkit_core.plugin import FedkitError, Option, hookimpl

fedkit_api = 2


@hookimpl
def fedkit_options():
    return [
        Option("max_margin", float, 0.5, "the largest class margin (in cosine units)", min=0.0),
        Option("scale", float, 30.0, "scale s of the cosine logits", min=0.0),
        Option(
            "drw_round",
            int,
            None,
            "first round of the class re-weighting (null: the round at 80% of `rounds`, as "
            "the authors' epoch 160 of 200)",
            min=1,
        ),
        Option(
            "beta",
            float,
            0.9999,
            "beta of the re-weighting's effective number",
            min=0.0,
            lt=1,
        ),
    ]


@hookimpl
def fedkit_check(server):
    return check_task_loss(server, "ldam-drw")


class CosineClassifier(nn.Module):
    """``s * cos(h, w_c)``: the authors' ``NormedLinear`` with the scale built in."""

    def __init__(self, in_features: int, num_classes: int, scale: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, num_classes).uniform_(-1, 1))
        self.scale = scale

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.scale * F.normalize(features, dim=1) @ F.normalize(self.weight, dim=0)


@hookimpl
def fedkit_extend_model(model, ctx):
    """Replace the built-in linear head by the scaled cosine classifier (server and clients)."""
    if type(model.head) is not nn.Linear:
        raise FedkitError(
            "ldam-drw replaces the built-in linear classifier by a cosine one, but the head is "
            f"a {type(model.head).__name__} (another plugin replaced it); run them separately"
        )
    model.head = CosineClassifier(model.feature_dim, ctx.task.num_classes, ctx.options()["scale"])


def margins(n: torch.Tensor, max_margin: float) -> torch.Tensor:
    """``n_c^(-1/4)`` scaled so the largest is ``max_margin``; classes absent locally (never
    a local target) get ``max_margin``."""
    present = n > 0
    raw = torch.where(present, n.clamp_min(1) ** -0.25, torch.zeros_like(n))
    return torch.where(present, raw * (max_margin / raw.max()), torch.full_like(n, max_margin))


def drw_start(drw_round: int | None, rounds: int) -> int:
    """The first re-weighted round: the option, or the round at 80% of the run."""
    return drw_round if drw_round is not None else max(1, math.ceil(0.8 * rounds))


def ldam_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    margin: torch.Tensor,
    scale: float,
    weight: torch.Tensor | None,
) -> torch.Tensor:
    """``CE(logits - s * Delta_y at the target, weight)``; ``logits`` are already scaled."""
    shift = F.one_hot(target, logits.shape[1]) * (scale * margin[target])[:, None]
    return F.cross_entropy(logits - shift, target, weight=weight)


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    opts = client.options()
    n = counts(client)
    weight = None
    if client.round >= drw_start(opts["drw_round"], client.config["rounds"]):
        weight = class_balanced_weights(n, opts["beta"])
    return ldam_loss(
        outputs["logits"], batch.y, margins(n, opts["max_margin"]), opts["scale"], weight
    )
