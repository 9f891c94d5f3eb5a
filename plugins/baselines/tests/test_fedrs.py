"""FedRS's restricted softmax against a hand computation, and a run next to FedProx."""

import math

import fedkit_baselines.fedprox as fedprox
import fedkit_baselines.fedrs as fedrs
import pytest
import torch

from fedkit_core import run
from fedkit_core.plugin import plugin_scope

from .lossfakes import batch, client, small


def test_only_the_missing_classes_are_scaled_by_alpha():
    logits = torch.tensor([[2.0, 4.0, -1.0]])
    out = fedrs.restricted_logits(logits, torch.tensor([3.0, 0.0, 2.0]), alpha=0.25)
    assert out.tolist() == [[2.0, 1.0, -1.0]]


def test_task_loss_is_cross_entropy_of_the_restricted_logits():
    me = client([3, 0, 2], {"alpha": 0.25})
    with plugin_scope("fedrs"):
        loss = fedrs.fedkit_task_loss(me, batch([0]), {"logits": torch.tensor([[2.0, 4.0, -1.0]])})
    hand = -math.log(math.exp(2) / (math.exp(2) + math.exp(1) + math.exp(-1)))
    assert loss.item() == pytest.approx(hand)


def test_alpha_one_is_plain_cross_entropy():
    logits = torch.randn(4, 3)
    same = fedrs.restricted_logits(logits, torch.tensor([3.0, 0.0, 0.0]), alpha=1.0)
    assert torch.equal(same, logits)


def test_runs_with_fedprox():
    results = run(small(), plugins={"fedrs": fedrs, "fedprox": fedprox})
    train = next(iter(results.rounds[0]["train"].values()))
    assert train["loss.fedprox.proximal"] > 0
    assert 0 <= results.final["global"]["bacc"] <= 1
