"""Task splits hold plain, contiguous tensors whatever the loader built them with."""

import numpy as np
import torch

from fedkit_core.contract.data import Split


def test_split_strips_tensor_subclasses():
    from monai.data import MetaTensor

    images = MetaTensor(torch.zeros(2, 1, 4, 4))
    split = Split(images, torch.zeros(2, 4, 4, dtype=torch.long))
    assert type(split.images) is torch.Tensor
    assert type((split.images * 2).sum()) is torch.Tensor


def test_split_makes_channels_last_views_contiguous():
    """Decoded HWC images permuted to CHW are views; the cache stores them contiguous, and a
    convolution gives (slightly) different numbers for the two layouts."""
    hwc = torch.randint(0, 255, (2, 8, 8, 3), dtype=torch.uint8)
    split = Split(hwc.permute(0, 3, 1, 2), torch.zeros(2, 8, 8, dtype=torch.long))
    assert split.images.is_contiguous()
    assert torch.equal(split.images, hwc.permute(0, 3, 1, 2))


def test_normalizer_statistics_match_numpy_for_any_layout():
    from fedkit_core.contract.data import TaskData
    from fedkit_core.tasks.loading import fit_normalizer

    hwc = torch.randint(0, 255, (10, 6, 6, 3), dtype=torch.uint8)
    labels = torch.zeros(10, dtype=torch.long)

    def stats(images):
        data = TaskData("classification", ["a"], {"s": {"train": Split(images, labels)}})
        return fit_normalizer(data, chunk=3)

    expected = hwc.numpy().astype("float64") / 255.0
    norm = stats(hwc.permute(0, 3, 1, 2))
    assert norm == stats(hwc.permute(0, 3, 1, 2).contiguous())
    assert np.allclose(norm.mean, expected.mean(axis=(0, 1, 2)))
    assert np.allclose(norm.std, expected.std(axis=(0, 1, 2), ddof=1))


def test_normalizer_samples_the_sites_as_if_pooled():
    from fedkit_core.contract.data import TaskData
    from fedkit_core.tasks.loading import fit_normalizer

    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 255, (7, 2, 4, 4), dtype=torch.uint8, generator=gen)
    b = torch.randint(0, 255, (6, 2, 4, 4), dtype=torch.uint8, generator=gen)

    def split(x):
        return {"train": Split(x, torch.zeros(len(x), dtype=torch.long))}

    data = TaskData("classification", ["a"], {"a": split(a), "b": split(b)})
    norm = fit_normalizer(data, max_images=4)  # every 3rd image of the 13
    expected = torch.cat([a, b])[::3].double().div(255).transpose(0, 1).reshape(2, -1)
    assert np.allclose(norm.mean, expected.mean(dim=1).numpy())
    assert np.allclose(norm.std, expected.std(dim=1).numpy())
