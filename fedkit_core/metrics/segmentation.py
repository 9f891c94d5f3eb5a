"""Segmentation metrics: hard (argmax) Dice per sample and class (MONAI), then averaged.

``dice`` is the mean over samples of the mean over foreground classes; ``dice_bg`` also
averages the background class (Fed-LWR's code reports that one). A class absent from both
the prediction and the ground truth of a sample scores 1 (MONAI ``ignore_empty=False``).
With several foreground classes, ``dice_<class name>`` is reported per class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedkit_core.extras import require


def per_sample_dice(logits: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, C) hard Dice of argmax(logits) against target label maps, background included."""
    require("monai", "the Dice metric (segmentation)")
    from monai.metrics import compute_dice

    def one_hot(labels: torch.Tensor) -> torch.Tensor:
        return F.one_hot(labels.long(), num_classes).movedim(-1, 1).float()

    return compute_dice(
        one_hot(logits.argmax(1)), one_hot(target), include_background=True, ignore_empty=False
    )


def segmentation_metrics(dice: np.ndarray, class_names: Sequence[str]) -> dict[str, float]:
    if len(dice) == 0:
        return {}
    out = {
        "dice": float(np.nanmean(np.nanmean(dice[:, 1:], axis=1))),
        "dice_bg": float(np.nanmean(np.nanmean(dice, axis=1))),
    }
    if dice.shape[1] > 2:
        for c, name in enumerate(class_names[1:], start=1):
            out[f"dice_{name}"] = float(np.nanmean(dice[:, c]))
    return out
