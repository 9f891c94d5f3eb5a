"""LDAM-DRW's margins, cosine head and deferred re-weighting against hand computations."""

import math

import fedkit_baselines.ldam_drw as ldam
import fedkit_baselines.moon as moon
import pytest
import torch
import torch.nn.functional as F

from fedkit_core import FedkitError, run
from fedkit_core.plugin import plugin_scope

from .lossfakes import batch, client, small


def test_margins_scale_with_the_count_to_the_minus_quarter():
    out = ldam.margins(torch.tensor([16.0, 1.0, 0.0]), max_margin=0.5)
    # 16^(-1/4) = 0.5, 1^(-1/4) = 1 -> scaled so the largest is 0.5; absent class: 0.5
    assert out.tolist() == pytest.approx([0.25, 0.5, 0.5])


def test_the_target_logit_loses_scale_times_its_margin():
    logits = torch.tensor([[3.0, 1.0], [0.0, 2.0]])
    loss = ldam.ldam_loss(logits, torch.tensor([0, 1]), torch.tensor([0.25, 0.5]), 2.0, None)
    hand = (math.log(1 + math.exp(1 - 2.5)) + math.log(1 + math.exp(0 - 1.0))) / 2
    assert loss.item() == pytest.approx(hand)


def test_cosine_head_is_the_scaled_cosine():
    head = ldam.CosineClassifier(3, 2, scale=30.0)
    h = torch.randn(4, 3)
    cos = F.cosine_similarity(h[:, :, None], head.weight[None], dim=1)
    assert torch.allclose(head(h), 30 * cos, atol=1e-5)


def test_reweighting_starts_at_the_deferred_round():
    assert ldam.drw_start(None, 10) == 8 and ldam.drw_start(None, 1) == 1
    assert ldam.drw_start(3, 10) == 3
    opts = {"max_margin": 0.5, "scale": 1.0, "drw_round": 3, "beta": 0.5}
    logits = torch.tensor([[0.2, 0.1], [0.3, -0.4], [0.0, 0.5]])
    y = [0, 0, 1]
    losses = {}
    for rnd in (2, 3):
        me = client([2, 1], opts, round=rnd, config={"rounds": 10})
        with plugin_scope("ldam-drw"):
            losses[rnd] = ldam.fedkit_task_loss(me, batch(y), {"logits": logits}).item()
    m = ldam.margins(torch.tensor([2.0, 1.0]), 0.5)
    per_sample = F.cross_entropy(
        logits - F.one_hot(torch.tensor(y), 2) * m[y][:, None], torch.tensor(y), reduction="none"
    )
    # beta 0.5: (1 - 0.5) / (1 - 0.5^2) = 2/3 and (1 - 0.5) / (1 - 0.5) = 1 -> 0.8, 1.2
    w = torch.tensor([0.8, 0.8, 1.2])
    assert losses[2] == pytest.approx(per_sample.mean().item(), rel=1e-5)
    assert losses[3] == pytest.approx(((w * per_sample).sum() / w.sum()).item(), rel=1e-5)


def test_runs_reweighted():
    results = run(small(**{"ldam-drw": {"drw_round": 1}}), plugins={"ldam-drw": ldam})
    assert 0 <= results.final["global"]["bacc"] <= 1


def test_two_head_replacements_are_refused():
    with pytest.raises(FedkitError, match="run them separately"):
        run(small(), plugins={"moon": moon, "ldam-drw": ldam})
