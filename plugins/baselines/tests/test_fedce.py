"""FedCE: contribution weights against a hand computation; classification and segmentation runs."""

import math

import pytest
import torch
from fedkit_baselines import fedce

from fedkit_core import run
from fedkit_core.testing import tiny, tiny_seg


def test_gradient_cosines_by_hand():
    d = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])]
    prior = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    cos = fedce.gradient_cosines(d, prior)
    # consensus = 0.5*d0 + 0.25*d1 + 0.25*d2 = (0.75, 0.5)
    # d0 vs (0.25, 0.5): 0.25/sqrt(0.3125); d1 vs (0.75, 0.25): 0.25/sqrt(0.625)
    # d2 vs (0.5, 0.25): 0.75/(sqrt(2)*sqrt(0.3125))
    assert cos == pytest.approx(
        [
            0.25 / math.sqrt(0.3125),
            0.25 / math.sqrt(0.625),
            0.75 / (math.sqrt(2) * math.sqrt(0.3125)),
        ]
    )


@pytest.mark.parametrize("mode", ["sum", "product"])
def test_contributions_by_hand(mode):
    history = [[0.2, 0.4], [0.9], [0.5]]  # mean cosines 0.3, 0.9, 0.5
    minus = [0.6, 0.3, 0.1]  # what the clients sent: 1 - mean leave-one-out score
    grad = [0.7 / 1.3, 0.1 / 1.3, 0.5 / 1.3]
    data = [0.6, 0.3, 0.1]
    merged = (
        [g + m for g, m in zip(grad, data)]
        if mode == "sum"
        else [g * m for g, m in zip(grad, data)]
    )
    expected = [m / sum(merged) for m in merged]
    got = fedce.contributions(history, minus, mode, floor=1e-3)
    assert got.tolist() == pytest.approx(expected)


def test_the_floor_keeps_every_client_in():
    got = fedce.contributions([[1.0], [0.0]], [0.0, 1.0], "product", floor=1e-3)
    assert got[0].item() == pytest.approx(1e-3)


def test_aggregation_uses_the_contributions_and_each_client_learns_only_its_own():
    results = run(tiny(rounds=3), plugins={"fedce": fedce})
    scores = [c["fedce.minus_score"] for r in results.rounds for c in r["train"].values()]
    # round 1: no previous local model yet, so 1 - mean([0]) = 1; later the leave-one-out
    # model scores something on the client's validation split
    assert scores[:3] == [1.0, 1.0, 1.0] and any(s < 1.0 for s in scores[3:])
    assert results.final["global"]["bacc"] >= 0


def test_segmentation_runs():
    results = run(tiny_seg(rounds=2), plugins={"fedce": fedce})
    assert "dice" in results.final["global"]
