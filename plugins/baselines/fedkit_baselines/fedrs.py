"""FedRS: restricted softmax, damping the logits of classes a client does not have.

Li, Zhan. "FedRS: Federated Learning with Restricted Softmax for Label Distribution
Non-IID Data." KDD 2021.

During local training, the logit of every class absent from the client's own training data
is scaled by ``alpha`` (``o_c = alpha_c * w_c^T h``; ``alpha_c = 1`` for local classes), so
local updates push the missing classes' classifier weights less. Evaluation uses the raw
logits. The paper's classifier has no bias; with fedkit's linear head the bias is scaled
along with ``w_c^T h``. Classification only; aggregation is unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedkit_baselines.imbalance import check_task_loss, counts
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2


@hookimpl
def fedkit_options():
    return [
        Option(
            "alpha", float, 0.5, "scale of the logits of classes missing locally", min=0.0, max=1.0
        )
    ]


@hookimpl
def fedkit_check(server):
    return check_task_loss(server, "fedrs")


def restricted_logits(logits: torch.Tensor, n: torch.Tensor, alpha: float) -> torch.Tensor:
    """Logits with each locally absent class (``n = 0``) scaled by ``alpha``."""
    return logits * torch.where(n > 0, torch.ones_like(n), torch.full_like(n, alpha))


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    alpha = client.options()["alpha"]
    return F.cross_entropy(restricted_logits(outputs["logits"], counts(client), alpha), batch.y)
