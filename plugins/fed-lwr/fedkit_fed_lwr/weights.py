"""Server side of Fed-LWR: similarities -> per-layer client weights -> re-aggregated state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedkit_core.plugin import Arrays, average_entry
from fedkit_fed_lwr.layers import assign

#: The authors' clipping of the similarity before it becomes a weight.
DEFAULT_CLIP = (1e-4, 0.99)


def client_weights(
    similarities: Sequence[float], clip: Sequence[float] = DEFAULT_CLIP
) -> torch.Tensor:
    """``rho_k = (1 - clip(delta_k)) / sum_i (1 - clip(delta_i))`` (the paper's Eq. 5):
    the client whose features differ most from the anchor's gets the largest weight."""
    lo, hi = clip
    dissimilarity = 1.0 - torch.tensor(list(similarities), dtype=torch.float64).clamp(lo, hi)
    return dissimilarity / dissimilarity.sum()


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
