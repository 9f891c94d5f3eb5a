"""Per-FedAvg: the first-order and Hessian-free meta-gradients against autograd on a small
model, and the personalisation step before evaluation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fedkit_baselines.perfedavg import MetaGradient
from torch import nn

from fedkit_core import run
from fedkit_core.plugin import Batch
from fedkit_core.testing import tiny


def regression(seed: int, n: int = 6) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g), torch.arange(n))


def mse(model, batch, params=None):
    out = (
        model(batch.x) if params is None else torch.func.functional_call(model, params, (batch.x,))
    )
    return ((out - batch.y) ** 2).mean()


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_the_meta_gradient_is_the_papers(variant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    d, d1, d2 = regression(1), regression(2), regression(3)
    extra = iter([d1, d2])
    client = SimpleNamespace(
        model=model,
        round=1,
        options=lambda: {"alpha": 0.05, "variant": variant, "delta": 1e-3},
        forward=lambda m, x: {"logits": m(x)},
        task_loss=lambda batch, out: ((out["logits"] - batch.y) ** 2).mean(),
    )
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    meta = MetaGradient(client, params)
    meta.next_batch = lambda: next(extra)
    w = {n: p.detach().clone() for n, p in model.named_parameters()}
    first = torch.autograd.grad(mse(model, d), params)
    for p, g in zip(params, first):
        p.grad = g.clone()
    meta(None, (), {})
    # by hand: temp = w - alpha grad f(w; D); FO: grad f(temp; D')
    temp = {n: (w[n] - 0.05 * g).requires_grad_(True) for n, g in zip(names, first)}
    outer = torch.autograd.grad(mse(model, d1, temp), list(temp.values()))
    if variant == "hf":  # minus alpha H(w; D'') outer, the exact Hessian-vector product
        at = {n: w[n].clone().requires_grad_(True) for n in names}
        grads = torch.autograd.grad(mse(model, d2, at), list(at.values()), create_graph=True)
        hvp = torch.autograd.grad(grads, list(at.values()), grad_outputs=outer)
        outer = [o - 0.05 * h for o, h in zip(outer, hvp)]
    for p, n, expected in zip(params, names, outer):
        assert torch.allclose(p.grad, expected, atol=1e-5), n
        assert torch.equal(p.detach(), w[n]), "the parameters are back at w for the outer step"


def test_clients_are_scored_after_their_personalisation_step():
    none = run(tiny(rounds=1, plugins=["perfedavg"], perfedavg={"eval_steps": 0}))
    views = none.final["views"]
    assert views["personal"]["clients"] == views["global"]["clients"]  # the copy is the model
    tuned = run(tiny(rounds=1, plugins=["perfedavg"], perfedavg={"eval_steps": 2}))
    assert tuned.final["views"]["global"] == views["global"]  # same training
    assert tuned.final["clients"] != none.final["clients"]
