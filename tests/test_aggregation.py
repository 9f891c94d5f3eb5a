"""Weighted averaging of state entries (the mechanism behind FedAvg and custom aggregators)."""

import pytest
import torch

from fedkit_core.aggregation import weighted_average


def test_weighted_average_normalises_weights_and_keeps_dtypes():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(10)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(21)}
    out = weighted_average([a, b], [1, 3])
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert out["n"].dtype == torch.int64 and out["n"].item() == round(0.25 * 10 + 0.75 * 21)


def test_weights_must_be_nonnegative_with_positive_sum():
    with pytest.raises(ValueError):
        weighted_average([{"w": torch.ones(1)}], [0])
