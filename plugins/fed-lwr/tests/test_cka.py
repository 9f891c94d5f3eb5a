"""The CKA estimator against direct numpy computations, and its invariances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from fedkit_fed_lwr.cka import block_grams, cka_from_terms, hsic, hsic_terms


def unbiased_hsic_by_definition(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    """Song et al.'s HSIC_1 as the U-statistic it is: the mean over ordered quadruples of
    distinct indices of k_ij l_ij + k_ij l_qr - 2 k_ij l_iq."""
    n = len(k)
    total = sum(
        k[i, j] * l[i, j] + k[i, j] * l[q, r] - 2 * k[i, j] * l[i, q]
        for i, j, q, r in itertools.permutations(range(n), 4)
    )
    return total / (n * (n - 1) * (n - 2) * (n - 3))


def biased_hsic_by_definition(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    n = len(k)
    h = np.eye(n) - np.ones((n, n)) / n
    return float(np.trace(k @ h @ l @ h)) / (n - 1) ** 2


def feature_cka(u: np.ndarray, v: np.ndarray) -> float:
    """Kornblith et al.'s linear CKA in feature space (equals the biased-HSIC CKA)."""
    u, v = u - u.mean(0), v - v.mean(0)
    return np.linalg.norm(v.T @ u) ** 2 / (np.linalg.norm(u.T @ u) * np.linalg.norm(v.T @ v))


def cka(u: np.ndarray, v: np.ndarray, estimator: str = "unbiased", block: int | None = None):
    block = block or len(u)
    groups = zip(block_grams(torch.from_numpy(u), block), block_grams(torch.from_numpy(v), block))
    return cka_from_terms(sum(hsic_terms(gk, gl, estimator) for gk, gl in groups))


@pytest.fixture
def features() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    u = rng.normal(size=(7, 12)) + 2.0  # an offset the estimator must ignore
    v = u @ rng.normal(size=(12, 9)) + 0.5 * rng.normal(size=(7, 9))
    return u, v


@pytest.mark.parametrize("n", [4, 6, 7])
def test_unbiased_hsic_matches_the_u_statistic(n):
    rng = np.random.default_rng(n)
    u, v = rng.normal(size=(n, 5)), rng.normal(size=(n, 3))
    k, l = u @ u.T, v @ v.T  # noqa: E741
    expected = unbiased_hsic_by_definition(k, l)
    got = hsic(torch.from_numpy(k), torch.from_numpy(l)).item()
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_biased_hsic_matches_the_centering_matrix_formula(features):
    u, v = features
    k, l = u @ u.T, v @ v.T  # noqa: E741
    got = hsic(torch.from_numpy(k), torch.from_numpy(l), "biased").item()
    assert got == pytest.approx(biased_hsic_by_definition(k, l), rel=1e-9)
    assert cka(u, v, "biased") == pytest.approx(feature_cka(u, v), rel=1e-6)


def test_cka_matches_numpy_on_random_matrices(features):
    u, v = features
    k, l = u @ u.T, v @ v.T  # noqa: E741
    expected = unbiased_hsic_by_definition(k, l) / np.sqrt(
        unbiased_hsic_by_definition(k, k) * unbiased_hsic_by_definition(l, l)
    )
    assert cka(u, v) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_cka_invariances(features, estimator):
    u, v = features
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))  # a random orthogonal matrix
    base = cka(u, v, estimator)
    assert cka(u, u, estimator) == pytest.approx(1.0, abs=1e-6)
    assert cka(u @ q, v, estimator) == pytest.approx(base, rel=1e-5)
    assert cka(3.7 * u, 0.2 * v, estimator) == pytest.approx(base, rel=1e-5)
    assert cka(u + 5.0, v, estimator) == pytest.approx(base, rel=1e-5)
    assert cka(v, u, estimator) == pytest.approx(base, rel=1e-5)


def test_blocks_accumulate_hsic_and_skip_small_remainders():
    rng = np.random.default_rng(2)
    u, v = rng.normal(size=(15, 6)), rng.normal(size=(15, 6)) + rng.normal(size=(15, 1))
    # blocks of 4: [0:4], [4:8], [8:12], remainder [12:15] of 3 samples is skipped
    terms = np.zeros(3)
    for s in range(0, 12, 4):
        a, b = u[s : s + 4] @ u[s : s + 4].T, v[s : s + 4] @ v[s : s + 4].T
        terms += [
            unbiased_hsic_by_definition(a, b),
            unbiased_hsic_by_definition(a, a),
            unbiased_hsic_by_definition(b, b),
        ]
    expected = terms[0] / np.sqrt(terms[1] * terms[2])
    assert cka(u, v, block=4) == pytest.approx(expected, rel=1e-5)
    assert [g.shape for g in block_grams(torch.from_numpy(u), 4)] == [(3, 4, 4)]
    # a remainder of 4 or more is its own block
    assert [g.shape for g in block_grams(torch.from_numpy(u), 11)] == [(1, 11, 11), (1, 4, 4)]


def test_constant_features_have_no_cka():
    u = np.ones((8, 5))
    v = np.random.default_rng(3).normal(size=(8, 5))
    assert cka(u, v) is None


def test_unbiased_estimator_refuses_fewer_than_four_samples():
    g = torch.eye(3)
    with pytest.raises(ValueError, match="at least 4"):
        hsic(g, g)
