"""APFL: the mixture's gradients are Algorithm 1's (``alpha * grad`` for ``v``,
``<v - w, grad>`` for ``alpha``, nothing for ``w``), alpha is learned within [0, 1] or kept,
and clients are scored with the mixture."""

from __future__ import annotations

import pytest
import torch
from fedkit_baselines.apfl import Mixture
from torch import nn

from fedkit_core import run
from fedkit_core.plugin import FedModel
from fedkit_core.testing import tiny


def test_the_mixtures_gradients_are_the_papers():
    torch.manual_seed(0)
    model = FedModel(nn.Linear(3, 4), nn.Linear(4, 2), 4)
    mixture = Mixture(model, alpha=0.3, learn_alpha=True)
    with torch.no_grad():
        for p in mixture.personal.parameters():
            p.add_(torch.randn_like(p))  # v != w
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    loss = nn.functional.cross_entropy(mixture(x), y)
    loss.backward()
    # the same loss at the mixed parameters as plain tensors
    w = dict(model.named_parameters())
    v = dict(mixture.personal.named_parameters())
    mixed = {n: (0.3 * v[n] + 0.7 * w[n]).detach().requires_grad_(True) for n in v}
    hidden = nn.functional.linear(x, mixed["backbone.weight"], mixed["backbone.bias"])
    out = nn.functional.linear(hidden, mixed["head.weight"], mixed["head.bias"])
    grads = dict(
        zip(mixed, torch.autograd.grad(nn.functional.cross_entropy(out, y), list(mixed.values())))
    )
    for n in v:
        assert torch.allclose(v[n].grad, 0.3 * grads[n], atol=1e-6)
        assert w[n].grad is None  # the global model trains on its own loss only
    alpha_grad = sum(((v[n] - w[n]) * grads[n]).sum() for n in v)
    assert torch.allclose(mixture.alpha.grad, alpha_grad.detach(), atol=1e-6)


@pytest.mark.slow
def test_alpha_is_learned_within_its_range_or_kept():
    learned = run(tiny(rounds=2, plugins=["apfl"], apfl={"alpha_lr": 20.0}))
    alphas = [t["apfl.alpha"] for r in learned.rounds for t in r["train"].values()]
    assert all(0.0 <= a <= 1.0 for a in alphas) and any(a != 0.5 for a in alphas)
    assert set(learned.final["views"]) == {"global", "personal"}
    assert (
        learned.final["clients"]["site0"] == learned.final["views"]["personal"]["clients"]["site0"]
    )
    fixed = run(tiny(rounds=1, plugins=["apfl"], apfl={"learn_alpha": False}))
    assert {t["apfl.alpha"] for t in fixed.rounds[0]["train"].values()} == {0.5}
