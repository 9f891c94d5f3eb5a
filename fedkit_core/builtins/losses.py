"""The built-in task loss, chosen by the ``loss`` config key."""

from __future__ import annotations

import torch.nn.functional as F

from fedkit_core.contract.hookspecs import hookimpl
from fedkit_core.losses import balanced_softmax_ce, dice_loss


@hookimpl(trylast=True)
def fedkit_task_loss(client, batch, outputs):
    """CE, balanced softmax (with the client's own class priors), Dice or Dice + CE."""
    kind = client.config["loss"]
    logits = outputs["logits"]
    if kind == "ce":
        return F.cross_entropy(logits, batch.y)
    if kind == "bsm":
        return balanced_softmax_ce(logits, batch.y, client.log_prior())
    if kind == "dice":
        return dice_loss(logits, batch.y)
    return dice_loss(logits, batch.y) + F.cross_entropy(logits, batch.y)
