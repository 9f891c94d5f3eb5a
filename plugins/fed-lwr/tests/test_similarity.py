"""The client-side measurement: hooked layer outputs -> per-layer CKA (or cosine)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fedkit_fed_lwr.layers import DEFAULT_TYPES, find_layers
from fedkit_fed_lwr.similarity import layer_similarity
from torch import nn

from .nets import ClassicUNet
from .test_cka import unbiased_hsic_by_definition


def perturbed(model: nn.Module, scale: float, seed: int = 0) -> nn.Module:
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return other


def capture(model: nn.Module, x: torch.Tensor, layers: list[str]) -> dict[str, np.ndarray]:
    """Each layer's output, copied right away (before an in-place ReLU changes it)."""
    out, modules = {}, dict(model.named_modules())
    handles = [
        modules[n].register_forward_hook(
            lambda _m, _i, o, n=n: out.__setitem__(n, o.detach().flatten(1).double().numpy().copy())
        )
        for n in layers
    ]
    model.eval()
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return out


@pytest.fixture
def nets():
    torch.manual_seed(0)
    local = ClassicUNet()
    with torch.no_grad():  # non-trivial running statistics, so eval mode matters
        for m in local.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    return local, perturbed(local, 0.1)


def test_cka_per_layer_matches_a_direct_computation(nets):
    local, anchor = nets
    layers = find_layers(local, DEFAULT_TYPES)
    x = torch.randn(10, 1, 16, 16)
    got, used = layer_similarity(local, anchor.state_dict(), [x[:6], x[6:]], layers, block=6)
    assert used == 10  # blocks: [0:6] and the remainder [6:10] of 4 samples
    u, v = capture(local, x, layers), capture(anchor, x, layers)
    for name in layers:
        terms = np.zeros(3)
        for s in (slice(0, 6), slice(6, 10)):
            a, b = u[name][s] @ u[name][s].T, v[name][s] @ v[name][s].T
            terms += [
                unbiased_hsic_by_definition(a, b),
                unbiased_hsic_by_definition(a, a),
                unbiased_hsic_by_definition(b, b),
            ]
        assert got[name] == pytest.approx(terms[0] / np.sqrt(terms[1] * terms[2]), rel=1e-4), name
    assert set(got) == set(layers)
    assert min(got.values()) < 0.999  # the perturbation is visible


def test_forward_batches_of_many_blocks_give_the_same_cka(nets):
    local, anchor = nets
    layers = find_layers(local, DEFAULT_TYPES)
    x = torch.randn(21, 1, 16, 16)
    small, used_small = layer_similarity(local, anchor.state_dict(), x.split(4), layers, block=4)
    large, used_large = layer_similarity(local, anchor.state_dict(), x.split(16), layers, block=4)
    assert used_small == used_large == 20  # the last sample alone is skipped
    for name in layers:
        assert large[name] == pytest.approx(small[name], rel=1e-5)


def test_identical_models_are_fully_similar_and_mode_is_restored(nets):
    local, _ = nets
    local.train()
    layers = find_layers(local, DEFAULT_TYPES)
    x = torch.randn(8, 1, 16, 16)
    for measure in ("cka", "cosine"):
        got, _ = layer_similarity(local, local.state_dict(), [x], layers, measure=measure)
        assert got == pytest.approx(dict.fromkeys(layers, 1.0), abs=1e-5)
    assert local.training


def test_cosine_is_the_mean_per_sample_cosine(nets):
    local, anchor = nets
    layers = find_layers(local, DEFAULT_TYPES)
    x = torch.randn(5, 1, 16, 16)
    got, used = layer_similarity(
        local, anchor.state_dict(), [x[:3], x[3:]], layers, measure="cosine"
    )
    assert used == 5
    u, v = capture(local, x, layers), capture(anchor, x, layers)
    for name in layers:
        a, b = u[name], v[name]
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert got[name] == pytest.approx(cos.mean(), rel=1e-5)


def test_more_different_models_are_less_similar(nets):
    local, _ = nets
    layers = find_layers(local, DEFAULT_TYPES)
    x = torch.randn(16, 1, 16, 16)
    near, _ = layer_similarity(local, perturbed(local, 0.02, 1).state_dict(), [x], layers)
    far, _ = layer_similarity(local, perturbed(local, 0.3, 1).state_dict(), [x], layers)
    assert np.mean(list(far.values())) < np.mean(list(near.values())) < 1.0


def test_batches_under_four_samples_give_no_cka(nets):
    local, anchor = nets
    layers = find_layers(local, DEFAULT_TYPES)
    x = torch.randn(3, 1, 16, 16)
    assert layer_similarity(local, anchor.state_dict(), [x], layers, block=8) == ({}, 0)
