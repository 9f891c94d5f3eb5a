"""Partitioners: split one pool of training samples into per-client index arrays.

Each takes the pool's labels (``None`` for segmentation), the number of clients and a
numpy Generator, and returns one sorted index array per client.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedkit_core.errors import FedkitError


def iid(
    labels: np.ndarray | None, n: int, clients: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Uniformly at random, equal sizes."""
    return [np.sort(part) for part in np.array_split(rng.permutation(n), clients)]


def fractions(
    labels: np.ndarray | None,
    n: int,
    clients: int,
    rng: np.random.Generator,
    sizes: Sequence[float],
) -> list[np.ndarray]:
    """Given training-size fractions per client (FedHelp's 0.6/0.2/0.08/...), stratified by class."""
    if len(sizes) != clients:
        raise FedkitError(f"partition.fractions has {len(sizes)} entries for {clients} clients")
    share = np.asarray(sizes, dtype=float)
    if (share <= 0).any():
        raise FedkitError(f"partition.fractions must be positive, got {list(sizes)}")
    share = share / share.sum()
    groups = (
        [np.arange(n)]
        if labels is None
        else [np.flatnonzero(labels == c) for c in np.unique(labels)]
    )
    parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for idx in groups:
        for k, chunk in enumerate(allocate(rng.permutation(idx), share)):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def dirichlet(
    labels: np.ndarray, n: int, clients: int, rng: np.random.Generator, alpha: float, min_size: int
) -> list[np.ndarray]:
    """Label skew: each class is spread over clients with proportions ~ Dir(alpha)."""
    classes = int(labels.max()) + 1
    return class_dirichlet(labels, n, clients, rng, [alpha] * classes, 0.0, min_size)


def class_dirichlet(
    labels: np.ndarray,
    n: int,
    clients: int,
    rng: np.random.Generator,
    alphas: Sequence[float],
    drop_prob: float,
    min_size: int,
    tries: int = 1000,
) -> list[np.ndarray]:
    """One Dirichlet alpha per class, and each class removed from each client with
    probability ``drop_prob`` (FCA's ICH split 2: alphas 50/30/10/5/0.5, drop 0.3).

    Draws again until every client has at least ``min_size`` samples.
    """
    classes = int(labels.max()) + 1
    if len(alphas) != classes:
        raise FedkitError(f"partition.alphas has {len(alphas)} entries for {classes} classes")
    if not 0.0 <= drop_prob < 1.0:
        raise FedkitError(f"partition.drop_prob must lie in [0, 1), got {drop_prob}")
    min_size = min(min_size, n // clients)
    by_class = [np.flatnonzero(labels == c) for c in range(classes)]
    for _ in range(tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c, idx in enumerate(by_class):
            share = rng.dirichlet(np.full(clients, alphas[c]))
            keep = rng.random(clients) >= drop_prob
            if not keep.any():
                keep[np.argmax(share)] = True
            share = np.where(keep, share, 0.0)
            for k, chunk in enumerate(allocate(rng.permutation(idx), share / share.sum())):
                parts[k].append(chunk)
        result = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in result) >= min_size:
            return result
    raise FedkitError(
        f"could not draw a partition giving every one of {clients} clients at least {min_size} "
        f"samples in {tries} tries; raise partition.alpha(s), lower partition.min_size or use fewer clients"
    )


def allocate(index: np.ndarray, share: np.ndarray) -> list[np.ndarray]:
    """Cut ``index`` into consecutive chunks whose sizes follow ``share`` (largest remainders)."""
    exact = share * len(index)
    counts = np.floor(exact).astype(int)
    remainder = len(index) - counts.sum()
    if remainder > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:remainder]] += 1
    return np.split(index, np.cumsum(counts)[:-1])
