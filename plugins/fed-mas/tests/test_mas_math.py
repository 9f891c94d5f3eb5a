"""Fed-MAS arithmetic against values worked out by hand."""

import math

import pytest
import torch
from fedkit_fed_mas.mas import add_per_class, prior_distance, projector, rescue_factor


def test_prior_distance_is_two_minus_twice_the_cosine():
    projection = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0], [-1.0, 0.0]])
    target = torch.tensor([[5.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    # cosines 1, 0, 4/5, -1
    expected = torch.tensor([0.0, 2.0, 2 - 2 * 0.8, 4.0])
    torch.testing.assert_close(prior_distance(projection, target), expected)


def test_per_class_sums_and_counts():
    sums, counts = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.long)
    add_per_class(sums, counts, torch.tensor([0.0, 2.0, 0.4]), torch.tensor([0, 2, 2]))
    add_per_class(sums, counts, torch.tensor([1.0]), torch.tensor([0]))
    torch.testing.assert_close(sums, torch.tensor([1.0, 0.0, 2.4, 0.0], dtype=torch.float64))
    assert counts.tolist() == [2, 0, 2, 0]


def test_rescue_factor_normalises_over_present_classes_only():
    N = "normalised"  # the authors' code
    present = torch.tensor([True, False, True])
    w = torch.tensor([1.0, math.nan, 3.0])  # class 1 absent: its value must not matter
    w_hat = torch.tensor([2.0, 100.0, 2.0])
    # p = (1/4, 3/4), q = (1/2, 1/2): RF = 1/8 + 3/8
    assert rescue_factor(w, w_hat, present, N) == pytest.approx(0.5)
    # a client with one class always has RF = 1; K uniform classes give 1/K
    assert rescue_factor(torch.tensor([0.3]), torch.tensor([7.0]), torch.tensor([True]), N) == 1.0
    uniform = torch.ones(5)
    assert rescue_factor(uniform, 2 * uniform, torch.ones(5, dtype=bool), N) == pytest.approx(0.2)
    # a zero vector counts as uniform instead of dividing by zero
    zeros = torch.zeros(2)
    assert rescue_factor(zeros, torch.tensor([1.0, 3.0]), torch.ones(2, dtype=bool), N) == 0.5
    with pytest.raises(ValueError):
        rescue_factor(w, w_hat, torch.zeros(3, dtype=bool), N)


def test_raw_rescue_factor_is_the_papers_eq_3():
    present = torch.tensor([True, False, True])
    w = torch.tensor([1.0, math.nan, 3.0])
    w_hat = torch.tensor([2.0, 100.0, 2.0])
    # sum_k w_k w_hat_k over the present classes: 1 * 2 + 3 * 2
    assert rescue_factor(w, w_hat, present, "raw") == pytest.approx(8.0)
    assert rescue_factor(w, w_hat, present) == pytest.approx(8.0)  # the default
    assert rescue_factor(torch.zeros(2), torch.ones(2), torch.ones(2, dtype=bool), "raw") == 0.0
    with pytest.raises(ValueError):
        rescue_factor(w, w_hat, present, "other")


def test_only_the_raw_form_sees_how_far_a_client_is_from_the_prior():
    """Two clients whose distances have the same shape over classes, one three times as far
    from the prior: the normalised RF cannot tell them apart, Eq. 3 ranks the far one higher."""
    present = torch.ones(2, dtype=bool)
    near_w, near_w_hat = torch.tensor([0.25, 0.75]), torch.tensor([0.5, 0.5])
    far_w, far_w_hat = 3 * near_w, 3 * near_w_hat
    # normalised: p = (1/4, 3/4), q = (1/2, 1/2) for both: 1/8 + 3/8
    assert rescue_factor(near_w, near_w_hat, present, "normalised") == pytest.approx(0.5)
    assert rescue_factor(far_w, far_w_hat, present, "normalised") == pytest.approx(0.5)
    # raw: 0.25 * 0.5 + 0.75 * 0.5 = 0.5, and 0.75 * 1.5 + 2.25 * 1.5 = 4.5
    assert rescue_factor(near_w, near_w_hat, present, "raw") == pytest.approx(0.5)
    assert rescue_factor(far_w, far_w_hat, present, "raw") == pytest.approx(4.5)


def test_projector_shape_matches_the_paper():
    mlp = projector(512, 512, 2048)
    kinds = [type(m).__name__ for m in mlp]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert mlp(torch.randn(4, 512)).shape == (4, 2048)
