"""The normaliser a task's data gets when its loader brings none: statistics of its images.

Its own module because both :mod:`~fedkit_core.tasks.loading` and the cache (which stores
the statistics with the arrays) need it.
"""

from __future__ import annotations

import torch

from fedkit_core.contract.data import Normalizer, TaskData


def fit_normalizer(data: TaskData, max_images: int = 2048, chunk: int = 64) -> Normalizer:
    """Per-channel mean and std of (up to ``max_images``) pooled training images.

    Every ``step``-th image of the sites' training splits taken in order (as if pooled), read
    in place and summed in float64 a chunk at a time: no copy of the set, and the same
    statistics whatever the images' memory layout.
    """
    splits = [s["train"].images for s in data.sites.values() if "train" in s]
    step = max(1, sum(map(len, splits)) // max_images)
    picked, offset = [], 0
    for images in splits:
        first = (-offset) % step  # the first index of this site on the pooled grid
        picked.append(images[first::step])
        offset += len(images)
    scale = 255.0 if splits[0].dtype == torch.uint8 else 1.0
    channels = splits[0].shape[1]
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros(channels, dtype=torch.float64)
    count = 0
    for part in (p for images in picked for p in images.split(chunk)):
        x = part.to(torch.float64).transpose(0, 1).reshape(channels, -1) / scale
        total += x.sum(dim=1)
        squares += (x * x).sum(dim=1)
        count += x.shape[1]
    mean = total / count
    var = (squares - count * mean * mean) / max(count - 1, 1)
    std = var.clamp_min(0).sqrt().clamp_min(1e-6)
    return Normalizer(tuple(mean.tolist()), tuple(std.tolist()))
