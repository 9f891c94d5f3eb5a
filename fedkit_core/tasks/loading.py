"""Load a task's data for a config: call the loader, check what it returned, resize, normalise."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from fedkit_core.config import Config
from fedkit_core.contract.data import (
    CLASSIFICATION,
    MAX_CLASSES,
    SEGMENTATION,
    Normalizer,
    Split,
    TaskData,
)
from fedkit_core.errors import FedkitError
from fedkit_core.tasks.normalize import fit_normalizer
from fedkit_core.tasks.registry import get_task

log = logging.getLogger("fedkit")


def load_task(config: Config) -> TaskData:
    """The task's data, validated, resized to ``task.image_size`` and with a normaliser."""
    spec = get_task(config["task.name"])
    path = config["task.path"]
    if spec.needs_path and spec.data_status(path) != "found":
        raise spec.missing_data_error(path)
    data = spec.load(config)
    _validate(spec.name, data)
    size = _image_size(config, data)
    if size:
        data = resize(data, size)
    fixed = fixed_normalizer(config, int(data.sample_split().images.shape[1]))
    if fixed is not None:
        data.normalizer = fixed
    elif data.normalizer is None:
        data.normalizer = fit_normalizer(data)
    return data


def _image_size(config: Config, data: TaskData) -> int | None:
    """``task.image_size``, checked against the smallest side a pretrained backbone takes;
    unset, images smaller than that side are enlarged to it (with a warning)."""
    from fedkit_core.models import input_min_size

    size, least = config["task.image_size"], input_min_size(config["model"], config["pretrained"])
    if least is None:
        return size
    if size is not None and size < least:
        raise FedkitError(
            f"model={config['model']} needs images of at least {least} px; "
            f"task.image_size={size} is smaller"
        )
    images = data.sample_split().images
    if size is None and images.dim() == 4 and min(images.shape[-2:]) < least:
        log.warning(
            "model=%s needs images of at least %d px; the task's %s px images are enlarged to "
            "%d (set task.image_size to choose the size)",
            config["model"],
            least,
            "x".join(map(str, images.shape[-2:])),
            least,
        )
        return least
    return size


def fixed_normalizer(config: Config, channels: int) -> Normalizer | None:
    """The normaliser the config fixes (None: fit the training images' statistics).

    ``task.mean`` / ``task.std`` fix it: a run then scales its inputs as a paper or another
    framework does, e.g. 0.5 and 0.5 to [-1, 1]. Without them, a backbone that takes its
    pretraining's input (:func:`fedkit_core.models.input_statistics`) fixes it to that
    pretraining's normalisation (grey images: the mean of the RGB statistics), so that every
    party, whatever its data, feeds the network alike and its input adapter has nothing or
    little to rescale.
    """
    mean, std = config["task.mean"], config["task.std"]
    if mean is None and std is None:
        return _network_normalizer(config, channels)
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


def _network_normalizer(config: Config, channels: int) -> Normalizer | None:
    from fedkit_core.models import input_statistics

    stats = input_statistics(config["model"], config["pretrained"])
    if stats is None or channels not in (1, 3):
        return None
    mean, std = stats
    if channels == 1:
        mean, std = (sum(mean) / 3,), (sum(std) / 3,)
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
