"""Load a task's data for a config: call the loader, check what it returned, resize, normalise."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedkit_core.config import Config
from fedkit_core.errors import FedkitError
from fedkit_core.tasks.base import (
    CLASSIFICATION,
    MAX_CLASSES,
    SEGMENTATION,
    Normalizer,
    Split,
    TaskData,
)
from fedkit_core.tasks.normalize import fit_normalizer
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
    fixed = fixed_normalizer(config, int(data.sample_split().images.shape[1]))
    if fixed is not None:
        data.normalizer = fixed
    elif data.normalizer is None:
        data.normalizer = fit_normalizer(data)
    return data


def fixed_normalizer(config: Config, channels: int) -> Normalizer | None:
    """The normaliser ``task.mean`` / ``task.std`` fix (None when unset): a run then scales its
    inputs as a paper or another framework does, e.g. 0.5 and 0.5 to [-1, 1]."""
    mean, std = config["task.mean"], config["task.std"]
    if mean is None and std is None:
        return None
    if mean is None or std is None:
        raise FedkitError("task.mean and task.std go together: set both or neither")
    mean = mean * channels if len(mean) == 1 else mean
    std = std * channels if len(std) == 1 else std
    if len(mean) != channels or len(std) != channels:
        raise FedkitError(
            f"task.mean and task.std need 1 or {channels} values (the images' channels), "
            f"got {len(mean)} and {len(std)}"
        )
    return Normalizer(tuple(float(m) for m in mean), tuple(float(s) for s in std))


def _validate(name: str, data: TaskData) -> None:
    if data.kind not in (CLASSIFICATION, SEGMENTATION):
        raise FedkitError(f"task {name!r}: unknown kind {data.kind!r}")
    if data.num_classes > MAX_CLASSES:
        raise FedkitError(f"task {name!r}: {data.num_classes} classes, over {MAX_CLASSES}")
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
