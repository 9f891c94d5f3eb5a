"""Options and engine paths added for speed give the same results as before (issue 16)."""

import pytest
import torch

from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.loading import load_task
from fedkit_core.testing import tiny


def test_fixed_normalizer_scales_to_the_given_statistics():
    cfg, _ = resolve_config(tiny(**{"task.mean": [0.5], "task.std": [0.5]}))
    data = load_task(cfg)
    assert data.normalizer.mean == (0.5,) * 3 and data.normalizer.std == (0.5,) * 3
    x = torch.tensor([0, 255], dtype=torch.uint8).view(2, 1, 1, 1).expand(2, 3, 1, 1)
    assert data.normalizer(x).flatten().tolist() == [-1.0] * 3 + [1.0] * 3


def test_without_fixed_statistics_the_normalizer_is_fitted():
    cfg, _ = resolve_config(tiny())
    assert load_task(cfg).normalizer.std != (0.5,) * 3


@pytest.mark.parametrize(
    "values, message",
    [
        ({"task.mean": [0.5]}, "go together"),
        ({"task.mean": [0.5, 0.5], "task.std": [0.5, 0.5]}, "need 1 or 3 values"),
        ({"task.mean": [0.5], "task.std": [0.0]}, "task.std must be all above 0"),
    ],
)
def test_fixed_normalizer_refuses_bad_values(values, message):
    with pytest.raises(FedkitError, match=message):
        cfg, _ = resolve_config(tiny(**values))
        load_task(cfg)
