"""Training augmentation of the file tasks, built from MONAI's dictionary transforms.

Random flips along each spatial axis and, for 2D images, random 90-degree rotations,
applied to the image and (for segmentation) its mask alike, so labels stay exact (no
interpolation). Each call draws its seed from the client's per-round generator:
runs and resumed runs augment identically.
"""

from __future__ import annotations

import torch

from fedkit_core.extras import require
from fedkit_core.options import Option
from fedkit_core.tasks.base import SEGMENTATION, Augment, TaskData

#: the ``task.augment`` option of the file tasks (off: the papers state no augmentation)
AUGMENT_OPTION = Option(
    "augment", bool, False, "random flips and 90-degree rotations (MONAI) of training batches"
)


def attach(data: TaskData, enabled: bool) -> TaskData:
    """``data`` with :func:`flips_and_rotations` as its augmentation when ``enabled``."""
    if enabled:
        dims = data.sample_split().images.dim() - 2
        data.augment = flips_and_rotations(data.kind == SEGMENTATION, dims)
    return data


def flips_and_rotations(segmentation: bool, spatial_dims: int = 2) -> Augment:
    """An :data:`~fedkit_core.tasks.base.Augment` for batches (N, C, *spatial)."""
    require("monai", "task.augment=true")
    from monai.transforms import Compose, RandFlipd, RandRotate90d

    keys = ["image", "label"] if segmentation else ["image"]
    steps = [RandFlipd(keys=keys, prob=0.5, spatial_axis=axis) for axis in range(spatial_dims)]
    if spatial_dims == 2:  # square 2D images keep their shape under 90-degree rotations
        steps.append(RandRotate90d(keys=keys, prob=0.5, max_k=3, spatial_axes=(0, 1)))
    transform = Compose(steps)

    def augment(
        x: torch.Tensor, y: torch.Tensor, rng: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        transform.set_random_state(seed=int(torch.randint(2**31 - 1, (1,), generator=rng)))
        xs, ys = [], []
        for image, target in zip(x, y):
            sample = {"image": image}
            if segmentation:
                sample["label"] = target[None]
            out = transform(sample)
            xs.append(_plain(out["image"]))
            ys.append(_plain(out["label"])[0] if segmentation else target)
        return torch.stack(xs), torch.stack(ys)

    return augment


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A MONAI MetaTensor as a plain tensor (batches stay plain for models and losses)."""
    return t.as_tensor() if hasattr(t, "as_tensor") else t
