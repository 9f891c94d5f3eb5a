"""FedCB's arithmetic against hand computation: the class statistics (paper eq. 2, diagonal,
unbiased), the training and evaluation logits and the variance term of the loss (eqs. 4-5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fedkit_fedcb.classifier import FedCBHead, class_geometry, class_statistics, random_means


def test_statistics_match_a_hand_computation():
    # class 0: prompts along (3, 4) and (0, 2), i.e. unit vectors (0.6, 0.8) and (0, 1);
    # class 1: (1, 0), (0, -5), (2, 0): unit vectors (1, 0), (0, -1), (1, 0)
    emb = torch.tensor(
        [[[3.0, 4.0], [0.0, 2.0], [0.6, 0.8]], [[1.0, 0.0], [0.0, -5.0], [2.0, 0.0]]]
    )
    mu, sigma = class_statistics(emb)
    # class 0 unit vectors: (0.6, 0.8), (0, 1), (0.6, 0.8)
    mean0 = [(0.6 + 0 + 0.6) / 3, (0.8 + 1 + 0.8) / 3]
    var0 = [
        ((0.6 - mean0[0]) ** 2 * 2 + (0 - mean0[0]) ** 2) / 2,
        ((0.8 - mean0[1]) ** 2 * 2 + (1 - mean0[1]) ** 2) / 2,
    ]
    mean1 = [2 / 3, -1 / 3]
    var1 = [((1 - 2 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2, ((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2]
    np.testing.assert_allclose(mu.numpy(), [mean0, mean1], rtol=1e-6)
    np.testing.assert_allclose(sigma.numpy(), [var0, var1], rtol=1e-6)
    # the mean of unit vectors is not re-normalised
    assert mu[1].norm().item() == pytest.approx(math.sqrt(5) / 3, rel=1e-6)


def test_sigma_is_the_unbiased_diagonal_of_the_covariance():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(3, 7, 5, generator=g)
    mu, sigma = class_statistics(emb)
    assert sigma.shape == mu.shape == (3, 5)  # the diagonal only, per class
    unit = F.normalize(emb.double(), dim=-1).numpy()
    for k in range(3):
        cov = np.cov(unit[k], rowvar=False, ddof=1)
        np.testing.assert_allclose(sigma[k].numpy(), np.diag(cov), rtol=1e-5)
        biased = np.diag(np.cov(unit[k], rowvar=False, ddof=0))
        assert not np.allclose(sigma[k].numpy(), biased, rtol=1e-3)


def test_mean_only_keeps_the_mean_and_drops_the_variance():
    emb = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(1))
    mu, sigma = class_statistics(emb)
    mu_only, zero = class_statistics(emb, variance=False)
    torch.testing.assert_close(mu_only, mu)
    assert not zero.any() and sigma.all()
    with pytest.raises(ValueError, match="prompts >= 2"):
        class_statistics(emb[:, :1])


def test_random_means_are_unit_vectors_drawn_from_the_generator():
    a = random_means(4, 16, torch.Generator().manual_seed(3))
    b = random_means(4, 16, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a.norm(dim=1), torch.ones(4))


def test_logits_and_variance_term_follow_the_formulas():
    g = torch.Generator().manual_seed(2)
    mu, sigma = torch.randn(3, 4, generator=g), torch.rand(3, 4, generator=g)
    t = 7.5
    head = FedCBHead(5, mu, sigma, t)
    features = torch.randn(6, 5, generator=g)
    labels = torch.tensor([0, 1, 2, 2, 1, 0])
    z = (features @ head.proj.weight.T + head.proj.bias).detach().double().numpy()
    h = z / np.linalg.norm(z, axis=1, keepdims=True)
    m, s = mu.double().numpy(), sigma.double().numpy()
    train = np.array(
        [[t * h[i] @ m[k] + 0.5 * t**2 * (h[i] ** 2) @ s[k] for k in range(3)] for i in range(6)]
    )
    evaluation = np.array(
        [[h[i] @ m[k] + 0.5 * t * (h[i] ** 2) @ s[k] for k in range(3)] for i in range(6)]
    )
    penalty = np.array([0.5 * t**2 * (h[i] ** 2) @ s[labels[i]] for i in range(6)])
    head.train()
    np.testing.assert_allclose(head(features).detach().numpy(), train, rtol=1e-5)
    head.eval()
    np.testing.assert_allclose(head(features).detach().numpy(), evaluation, rtol=1e-5)
    got = head.variance_penalty(head.embed(features), labels).detach().numpy()
    np.testing.assert_allclose(got, penalty, rtol=1e-5)


def test_the_statistics_are_frozen_and_outside_the_state_dict():
    head = FedCBHead(5, torch.randn(3, 4), torch.rand(3, 4), 10.0)
    assert set(head.state_dict()) == {"proj.weight", "proj.bias"}
    assert [n for n, _ in head.named_parameters()] == ["proj.weight", "proj.bias"]
    head.train()
    loss = head(torch.randn(2, 5)).sum()
    loss.backward()
    assert head.mu.grad is None and not head.mu.requires_grad and not head.sigma.requires_grad
    assert head.proj.weight.grad is not None


def test_class_geometry_is_the_cosine_between_class_vectors():
    mu = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])  # two parallel, one orthogonal
    geometry = class_geometry(mu)
    assert geometry["max_cos"] == pytest.approx(1.0) and geometry["min_cos"] == pytest.approx(0.0)
    assert geometry["mean_cos"] == pytest.approx(1 / 3)
