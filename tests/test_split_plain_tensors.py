"""Task splits hold plain tensors even when a loader built them with MONAI transforms."""

import torch

from fedkit_core.tasks.base import Split


def test_split_strips_tensor_subclasses():
    from monai.data import MetaTensor

    images = MetaTensor(torch.zeros(2, 1, 4, 4))
    split = Split(images, torch.zeros(2, 4, 4, dtype=torch.long))
    assert type(split.images) is torch.Tensor
    assert type((split.images * 2).sum()) is torch.Tensor
