"""The focal loss against its formula, and a run."""

import fedkit_baselines.focal as focal
import pytest
import torch
import torch.nn.functional as F

from fedkit_core import run
from fedkit_core.plugin import plugin_scope

from .lossfakes import batch, client, small


def test_focal_loss_matches_the_formula():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 1.0]])
    y = [0, 2]
    with plugin_scope("focal"):
        loss = focal.fedkit_task_loss(
            client([1, 1, 1], {"gamma": 2.0}), batch(y), {"logits": logits}
        )
    p = F.softmax(logits, dim=1)[[0, 1], y]
    hand = (-((1 - p) ** 2) * p.log()).mean()
    assert loss.item() == pytest.approx(hand.item(), rel=1e-6)


def test_gamma_zero_is_cross_entropy():
    logits, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 0])
    with plugin_scope("focal"):
        loss = focal.fedkit_task_loss(client([1] * 4, {"gamma": 0.0}), batch(y), {"logits": logits})
    assert loss.item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)


def test_runs():
    results = run(small(), plugins={"focal": focal})
    assert 0 <= results.final["global"]["bacc"] <= 1
