"""Similarities -> normalised per-layer weights -> layer-wise re-aggregation."""

from __future__ import annotations

import pytest
import torch
from fedkit_fed_lwr.weights import (
    NO_CLIP,
    client_weights,
    layer_weights,
    reaggregate,
    weights_record,
)


def test_weights_are_normalised_dissimilarities():
    w = client_weights([0.9, 0.6, 0.95])
    assert w.tolist() == pytest.approx([0.1 / 0.55, 0.4 / 0.55, 0.05 / 0.55])
    assert float(w.sum()) == pytest.approx(1.0)


def test_similarities_are_clipped_before_weighting():
    # above 0.99 every client counts as 0.99: equal weights, not a division by ~0
    assert client_weights([0.999, 0.9999, 1.0]).tolist() == pytest.approx([1 / 3] * 3)
    # below 1e-4 (a negative CKA estimate) counts as 1e-4
    w = client_weights([-0.5, 0.5], clip=(1e-4, 0.99))
    assert w.tolist() == pytest.approx([(1 - 1e-4) / (1.5 - 1e-4), 0.5 / (1.5 - 1e-4)])
    assert client_weights([0.2, 0.8], clip=(0.5, 0.6)).tolist() == pytest.approx(
        [0.5 / 0.9, 0.4 / 0.9]
    )


def test_layer_weights_only_for_layers_every_client_reported():
    sims = [{"a": 0.5, "b": 0.9}, {"a": 0.75, "b": 0.8, "c": 0.1}]
    weights = layer_weights(sims)
    assert set(weights) == {"a", "b"}
    assert weights["a"].tolist() == pytest.approx([2 / 3, 1 / 3])
    assert weights["b"].tolist() == pytest.approx([1 / 3, 2 / 3])
    assert layer_weights([]) == {}


def test_reaggregation_per_layer_with_uniform_fallback():
    states = [
        {
            "enc.conv.weight": torch.full((2, 2), float(k)),
            "enc.bn.running_mean": torch.full((2,), 10.0 * k),
            "enc.bn.num_batches_tracked": torch.tensor(4 * k),
            "enc.act.weight": torch.tensor([float(k)]),  # a PReLU: in no layer
        }
        for k in (1, 2, 3)
    ]
    anchor = {key: sum(s[key].double() for s in states) / 3 for key in states[0]}
    weights = {
        "enc.conv": torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64),
        "enc.bn": torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64),
    }
    out = reaggregate(states, weights, anchor)
    assert torch.allclose(out["enc.conv.weight"], torch.full((2, 2), 1.75))
    assert torch.allclose(out["enc.bn.running_mean"], torch.full((2,), 30.0))
    assert out["enc.bn.num_batches_tracked"].item() == 12  # buffers follow their layer
    assert out["enc.bn.num_batches_tracked"].dtype == torch.int64
    assert out["enc.act.weight"] is anchor["enc.act.weight"]  # uniform average


def test_eq5_without_the_clip_weighs_what_the_clip_makes_uniform():
    """CKA 0.995 and 0.999: the authors' 0.99 clip makes them equal (the method is off in
    that layer); the paper's Eq. 5 gives the less similar client 5/6 of the weight."""
    assert client_weights([0.995, 0.999]).tolist() == pytest.approx([0.5, 0.5])
    assert client_weights([0.995, 0.999], clip=NO_CLIP).tolist() == pytest.approx([5 / 6, 1 / 6])
    # every client identical to the anchor: nothing to share out, the uniform average
    assert client_weights([1.0, 1.0000001], clip=NO_CLIP).tolist() == [0.5, 0.5]


def test_the_weights_record_counts_exactly_uniform_layers():
    weights = layer_weights([{"a": 0.999, "b": 0.5}, {"a": 0.995, "b": 0.9}])
    rec = weights_record(weights)
    assert rec["layers"] == 2 and rec["uniform_share"] == 0.5  # "a" is clipped to uniform
    assert rec["max_dev"] == pytest.approx(0.5 / 0.6 - 0.5)
    unclipped = weights_record(layer_weights([{"a": 0.999}, {"a": 0.995}], NO_CLIP))
    assert unclipped["uniform_share"] == 0.0
    assert weights_record({})["uniform_share"] == 1.0  # nothing weighted: the uniform average
