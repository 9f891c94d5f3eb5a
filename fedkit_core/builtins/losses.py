"""The built-in task loss, chosen by the ``loss`` config key."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedkit_core.hooks.hookspecs import hookimpl
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


def task_loss_per_sample(client, batch, outputs) -> torch.Tensor:
    """The built-in task loss of each sample of the batch, shape (N,): its mean is
    :func:`fedkit_task_loss` (to float rounding). DP-SGD's ghost clipping needs it."""
    kind = client.config["loss"]
    logits = outputs["logits"]
    if kind == "bsm":
        return _cross_entropy(logits + client.log_prior().to(logits.device), batch.y)
    if kind == "ce":
        return _cross_entropy(logits, batch.y)
    dice = dice_loss(logits, batch.y, per_sample=True)
    return dice if kind == "dice" else dice + _cross_entropy(logits, batch.y)


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each sample's cross-entropy (a segmentation sample's: the mean over its pixels)."""
    loss = F.cross_entropy(logits, target, reduction="none")
    return loss.reshape(len(target), -1).mean(1)
