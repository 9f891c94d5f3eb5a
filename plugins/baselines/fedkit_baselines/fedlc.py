"""FedLC: logit calibration against the client's own label distribution.

Zhang, Li, Li, Zhou, Wu, Wang, Tian. "Federated Learning with Label Distribution Skew via
Logits Calibration." ICML 2022 (PMLR 162).

The local loss is the cross-entropy of calibrated logits ``z_c - tau * n_c^(-1/4)``, with
``n_c`` the client's own training count of class ``c`` (never sent). Rare local classes get a
large offset, so the model must push their logits up further, which offsets the local bias
towards frequent classes. A class absent locally (``n_c = 0``) gets an infinite offset: it
drops out of the local softmax (the formula's limit). Evaluation uses the raw logits.
Classification only; aggregation is unchanged (combine with e.g. ``qfedavg``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedkit_baselines.imbalance import check_task_loss, counts
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2


@hookimpl
def fedkit_options():
    return [Option("tau", float, 1.0, "calibration strength tau of z - tau * n_c^(-1/4)", min=0.0)]


@hookimpl
def fedkit_check(server):
    return check_task_loss(server, "fedlc")


def calibrated_logits(logits: torch.Tensor, n: torch.Tensor, tau: float) -> torch.Tensor:
    """``z - tau * n^(-1/4)`` per class; ``-inf`` for a class with ``n = 0``."""
    offsets = torch.where(n > 0, n.clamp_min(1) ** -0.25, torch.full_like(n, float("inf")))
    return logits - tau * offsets


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    tau = client.options()["tau"]
    return F.cross_entropy(calibrated_logits(outputs["logits"], counts(client), tau), batch.y)
