"""Class-balanced weights and loss against hand computations."""

import fedkit_baselines.cb as cb
import pytest
import torch
import torch.nn.functional as F
from fedkit_baselines.imbalance import class_balanced_weights

from fedkit_core.plugin import plugin_scope

from .lossfakes import batch, client


def test_weights_are_inverse_effective_numbers_over_present_classes():
    # beta 0.5: (1 - 0.5)/(1 - 0.5^1) = 1, (1 - 0.5)/(1 - 0.5^2) = 2/3; sum to 2 present
    w = class_balanced_weights(torch.tensor([1.0, 2.0, 0.0]), beta=0.5)
    assert w.tolist() == pytest.approx([1.2, 0.8, 0.0])
    assert class_balanced_weights(torch.tensor([5.0, 9.0]), beta=0.0).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("base,gamma", [("ce", 0.0), ("focal", 2.0)])
def test_loss_is_the_mean_of_weighted_per_sample_losses(base, gamma):
    logits = torch.tensor([[1.0, 0.0, 0.3], [0.2, 0.9, -0.5], [0.0, 0.0, 0.0]])
    y = torch.tensor([0, 1, 1])
    opts = {"beta": 0.5, "base": base, "gamma": 2.0}
    with plugin_scope("cb"):
        loss = cb.fedkit_task_loss(client([1, 2, 0], opts), batch(y), {"logits": logits})
    p = F.softmax(logits, dim=1)[[0, 1, 2], y]
    per_sample = -((1 - p) ** gamma) * p.log()
    hand = (torch.tensor([1.2, 0.8, 0.8]) * per_sample).mean()
    assert loss.item() == pytest.approx(hand.item(), rel=1e-6)
