"""U-Net weight maps against hand-computed values."""

import numpy as np
import pytest
import torch

from fedkit_core.losses.weight_maps import weight_map, weight_maps


def test_two_objects_on_a_line_by_hand():
    mask = np.zeros((1, 8), int)
    mask[0, [0, 3]] = 1  # two one-pixel objects at x = 0 and x = 3
    # d1 + d2 per pixel: 0+3, 1+2, 2+1, 3+0, then 1+4, 2+5, 3+6, 4+7
    sums = np.array([3, 3, 3, 3, 5, 7, 9, 11.0])
    balance = np.where(mask[0] == 1, 8 / (2 * 2), 8 / (2 * 6))  # n / (C * n_c)
    expected = balance + 10 * np.exp(-(sums**2) / (2 * 5.0**2))
    assert np.allclose(weight_map(mask, w0=10, sigma=5), expected[None], atol=1e-5)
    assert np.allclose(weight_map(mask, w0=0), balance[None])


def test_one_object_has_no_border_term_and_diagonal_pixels_are_one_object():
    mask = np.zeros((4, 4), int)
    mask[1, 1] = mask[2, 2] = 1  # 8-connected: a single object
    w = weight_map(mask)
    assert np.allclose(w[mask == 1], 16 / (2 * 2)) and np.allclose(w[mask == 0], 16 / (2 * 14))
    assert np.allclose(weight_map(np.zeros((3, 3), int)), 1.0)  # one class: weight 1


def test_classes_are_separate_objects_and_unknown_pixels_weigh_one():
    mask = np.array([[1, 2, -1]])
    w = weight_map(mask, w0=10, sigma=5)
    # classes 1 and 2 are one object each, distance 1 apart: d1 + d2 = 1 on both, 2 at x=2
    assert np.allclose(w[0, :2], 2 / (2 * 1) + 10 * np.exp(-1 / 50))
    assert w[0, 2] == 1.0
    batch = weight_maps(torch.from_numpy(np.stack([mask, mask])))
    assert batch.shape == (2, 1, 3) and torch.allclose(batch[1], torch.from_numpy(w))
    with pytest.raises(ValueError):
        weight_map(np.zeros((2, 2, 2), int))


def test_many_objects_match_a_brute_force_reference():
    rng = np.random.default_rng(0)
    mask = np.zeros((40, 90), int)
    mask[::2, ::2] = rng.random((20, 45)) > 0.9  # single pixels, never 8-adjacent
    objects = [np.argwhere(mask == 1)[i] for i in range(int(mask.sum()))]
    yy, xx = np.mgrid[:40, :90]
    dist = np.sort([np.hypot(yy - y, xx - x) for y, x in objects], axis=0)
    n, n1 = mask.size, mask.sum()
    balance = np.where(mask == 1, n / (2 * n1), n / (2 * (n - n1)))
    expected = balance + 10 * np.exp(-((dist[0] + dist[1]) ** 2) / 50)
    assert np.allclose(weight_map(mask), expected, atol=1e-5)
