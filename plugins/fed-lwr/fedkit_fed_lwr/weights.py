"""Server side of Fed-LWR: similarities -> per-layer client weights -> re-aggregated state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedkit_core.plugin import Arrays, average_entry
from fedkit_fed_lwr.layers import assign

#: The authors' clipping of the similarity before it becomes a weight.
DEFAULT_CLIP = (1e-4, 0.99)
#: ``weighting`` choices: the authors' clip (default), or the paper's Eq. 5 as printed
CLIPPED, EQ5 = "clipped", "eq5"
#: Eq. 5 unclipped: only CKA's own range [0, 1] (the unbiased estimator strays past it)
NO_CLIP = (0.0, 1.0)
#: a weight this close to 1/K counts as exactly uniform (float64 arithmetic)
UNIFORM_TOL = 1e-12


def client_weights(
    similarities: Sequence[float], clip: Sequence[float] = DEFAULT_CLIP
) -> torch.Tensor:
    """``rho_k = (1 - clip(delta_k)) / sum_i (1 - clip(delta_i))`` (the paper's Eq. 5):
    the client whose features differ most from the anchor's gets the largest weight. With
    ``clip`` reaching 1 (:data:`NO_CLIP`) a layer where every client's similarity is 1 has no
    dissimilarity to share out and keeps the uniform weights."""
    lo, hi = clip
    dissimilarity = 1.0 - torch.tensor(list(similarities), dtype=torch.float64).clamp(lo, hi)
    total = dissimilarity.sum()
    if total <= 0:
        return torch.full_like(dissimilarity, 1.0 / len(dissimilarity))
    return dissimilarity / total


def weights_record(weights: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """How far one aggregation's layer weights moved from the uniform average: the number of
    weighted layers, the share of them whose weights are exactly uniform (every client 1/K:
    the method switched off there, e.g. every CKA above the clip), and the mean and largest
    ``|rho - 1/K|`` over layers and clients (no weighted layer: all uniform). Aggregates
    only: no client's similarity or weight."""
    if not weights:
        return {"layers": 0.0, "uniform_share": 1.0, "mean_dev": 0.0, "max_dev": 0.0}
    table = torch.stack(list(weights.values()))  # (layers, clients)
    dev = (table - 1.0 / table.shape[1]).abs()
    uniform = (dev.max(dim=1).values <= UNIFORM_TOL).double()
    return {
        "layers": float(len(weights)),
        "uniform_share": float(uniform.mean()),
        "mean_dev": float(dev.mean()),
        "max_dev": float(dev.max()),
    }


def layer_weights(
    similarities: Sequence[Mapping[str, float]], clip: Sequence[float] = DEFAULT_CLIP
) -> dict[str, torch.Tensor]:
    """Weights over clients (in the order given) for each layer that every client reported."""
    if not similarities:
        return {}
    common = set(similarities[0]).intersection(*similarities[1:])
    return {
        layer: client_weights([s[layer] for s in similarities], clip) for layer in sorted(common)
    }


def reaggregate(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Mapping[str, torch.Tensor],
    anchor: Mapping[str, torch.Tensor],
) -> Arrays:
    """Every entry of a weighted layer (parameters and buffers) averaged with its layer's
    weights (the paper's Eq. 6); entries of no weighted layer keep the ``anchor`` (uniform)
    value. Entries map to layers by the longest module-name prefix."""
    owner = assign(anchor, weights)
    return {
        key: anchor[key]
        if owner[key] is None
        else average_entry([s[key] for s in states], weights[owner[key]])
        for key in anchor
    }
