"""Load a task's data for a config: call the loader, check what it returned, resize, normalise."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedkit_core.config import Config
from fedkit_core.errors import FedkitError
from fedkit_core.tasks.base import CLASSIFICATION, SEGMENTATION, Normalizer, Split, TaskData
from fedkit_core.tasks.registry import get_task


def load_task(config: Config) -> TaskData:
    """The task's data, validated, resized to ``task.image_size`` and with a normaliser."""
    spec = get_task(config["task.name"])
    path = config["task.path"]
    if spec.needs_path and spec.data_status(path) != "found":
        raise spec.missing_data_error(path)
    data = spec.load(config)
    _validate(spec.name, data)
    size = config["task.image_size"]
    if size:
        data = resize(data, size)
    if data.normalizer is None:
        data.normalizer = fit_normalizer(data)
    return data


def _validate(name: str, data: TaskData) -> None:
    if data.kind not in (CLASSIFICATION, SEGMENTATION):
        raise FedkitError(f"task {name!r}: unknown kind {data.kind!r}")
    if data.num_classes < 2:
        raise FedkitError(f"task {name!r}: needs at least two classes, found {data.num_classes}")
    if not data.sites:
        raise FedkitError(f"task {name!r}: the data holds no sites")
    for site, splits in data.sites.items():
        if "train" not in splits or len(splits["train"]) == 0:
            raise FedkitError(f"task {name!r}: site {site!r} has no training data")
        for split_name, split in splits.items():
            where = f"task {name!r}, site {site!r}, split {split_name!r}"
            if split.images.dim() not in (4, 5):
                raise FedkitError(
                    f"{where}: images must be (N, C, H, W[, D]), got {tuple(split.images.shape)}"
                )
            want = 1 if data.kind == CLASSIFICATION else split.images.dim() - 1
            if split.targets.dim() != want:
                raise FedkitError(f"{where}: targets have shape {tuple(split.targets.shape)}")
            low, high = (
                (int(split.targets.min()), int(split.targets.max())) if len(split) else (0, 0)
            )
            if low < 0 or high >= data.num_classes:
                raise FedkitError(
                    f"{where}: labels must lie in [0, {data.num_classes - 1}], found {low}..{high}"
                )


def resize(data: TaskData, size: int) -> TaskData:
    """Resize every 2D split to ``size`` x ``size`` (bilinear images, nearest masks)."""

    def one(split: Split) -> Split:
        if split.images.dim() != 4 or tuple(split.images.shape[-2:]) == (size, size):
            return split
        images = _resize_images(split.images, size)
        targets = split.targets
        if data.kind == SEGMENTATION:
            targets = _resize_masks(targets, size)
        return Split(images, targets)

    data.sites = {
        site: {k: one(v) for k, v in splits.items()} for site, splits in data.sites.items()
    }
    return data


def _resize_images(images: torch.Tensor, size: int, chunk: int = 512) -> torch.Tensor:
    out = []
    for start in range(0, len(images), chunk):
        x = images[start : start + chunk].float()
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        if images.dtype == torch.uint8:
            x = x.round().clamp(0, 255).to(torch.uint8)
        out.append(x)
    return torch.cat(out) if out else images


def _resize_masks(masks: torch.Tensor, size: int, chunk: int = 512) -> torch.Tensor:
    """Nearest-neighbour resize of (N, H, W) label masks, a chunk at a time, keeping the dtype
    (a float copy of a whole full-size mask set would take gigabytes)."""
    out = [
        F.interpolate(part[:, None].float(), size=(size, size), mode="nearest")[:, 0].to(
            masks.dtype
        )
        for part in masks.split(chunk)
    ]
    return torch.cat(out) if out else masks


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
