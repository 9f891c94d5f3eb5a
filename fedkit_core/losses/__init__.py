"""Loss functions shared by the built-in task loss and method plugins."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from fedkit_core.extras import require


def log_prior(counts: np.ndarray | torch.Tensor, eps: float) -> torch.Tensor:
    """``log(n_c / n + eps)``: the balanced-softmax offset; missing classes get ``log(eps)``."""
    counts = torch.as_tensor(np.asarray(counts), dtype=torch.float32)
    return torch.log(counts / counts.sum().clamp_min(1) + eps)


def balanced_softmax_ce(
    logits: torch.Tensor, target: torch.Tensor, log_prior: torch.Tensor
) -> torch.Tensor:
    """Balanced softmax (Ren et al. 2020): cross-entropy of ``logits + log prior``."""
    return F.cross_entropy(logits + log_prior.to(logits.device), target)


@lru_cache(maxsize=4)
def _dice(include_background: bool, reduction: str = "mean"):
    require("monai", "the Dice loss (segmentation)")
    from monai.losses import DiceLoss

    return DiceLoss(
        include_background=include_background, to_onehot_y=True, softmax=True, reduction=reduction
    )


def dice_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    include_background: bool = True,
    per_sample: bool = False,
) -> torch.Tensor:
    """Soft Dice loss (MONAI) of (N, C, ...) logits against (N, ...) label maps;
    ``per_sample``: each sample's loss, shape (N,), whose mean is the loss."""
    if per_sample:
        loss = _dice(include_background, "none")(logits, target.unsqueeze(1))
        return loss.flatten(1).mean(1)
    return _dice(include_background)(logits, target.unsqueeze(1))
