"""Training augmentation of the file tasks, built from MONAI's dictionary transforms.

``task.augment``: random flips along each spatial axis and, for 2D images, random
90-degree rotations, applied to the image and (for segmentation) its mask alike, so labels
stay exact (no interpolation). ``task.transforms``: the user's own list of MONAI
dictionary transforms instead, e.g. ``[{name: RandFlipd, prob: 0.5, spatial_axis: 0}]``
(the keys ``image`` and, for segmentation, ``label`` are filled in). Each call draws its
seed from the client's per-round generator: runs and resumed runs augment identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedkit_core.contract.data import SEGMENTATION, Augment, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError
from fedkit_core.extras import require

#: the ``task.augment`` option of the file tasks (off: the papers state no augmentation)
AUGMENT_OPTION = Option(
    "augment", bool, False, "random flips and 90-degree rotations (MONAI) of training batches"
)

#: ``task.transforms``: the user's MONAI dictionary transforms (the file tasks that take it)
TRANSFORMS_OPTION = Option(
    "transforms",
    "list[dict]",
    [],
    "training augmentation as MONAI dictionary transforms, e.g. "
    "[{name: RandFlipd, prob: 0.5, spatial_axis: 0}] (keys filled in; not with task.augment)",
)


def attach(data: TaskData, enabled: bool, transforms: Sequence[Mapping[str, Any]] = ()) -> TaskData:
    """``data`` with :func:`flips_and_rotations` as its augmentation when ``enabled``, or
    with :func:`from_specs` of ``transforms`` when given (both at once: an error)."""
    segmentation = data.kind == SEGMENTATION
    if enabled and transforms:
        raise FedkitError(
            "task.augment=true and task.transforms are both set: task.transforms replaces "
            "the built-in flips and rotations; keep one of them"
        )
    if enabled:
        dims = data.sample_split().images.dim() - 2
        data.augment = flips_and_rotations(segmentation, dims)
    elif transforms:
        data.augment = from_specs(transforms, segmentation)
    return data


def flips_and_rotations(segmentation: bool, spatial_dims: int = 2) -> Augment:
    """An :data:`~fedkit_core.contract.data.Augment` for batches (N, C, *spatial)."""
    require("monai", "task.augment=true")
    from monai.transforms import Compose, RandFlipd, RandRotate90d

    keys = ["image", "label"] if segmentation else ["image"]
    steps = [RandFlipd(keys=keys, prob=0.5, spatial_axis=axis) for axis in range(spatial_dims)]
    if spatial_dims == 2:  # square 2D images keep their shape under 90-degree rotations
        steps.append(RandRotate90d(keys=keys, prob=0.5, max_k=3, spatial_axes=(0, 1)))
    return _batches(Compose(steps), segmentation)


def from_specs(specs: Sequence[Mapping[str, Any]], segmentation: bool) -> Augment:
    """An :data:`~fedkit_core.contract.data.Augment` composing ``specs``: each names a MONAI
    dictionary transform (``name``, found in ``monai.transforms`` only) and its arguments.
    A bad spec fails here, before training, with one error naming it."""
    transforms = require("monai.transforms", "task.transforms", "monai")
    keys = ["image", "label"] if segmentation else ["image"]
    steps = []
    for k, spec in enumerate(specs):
        args = dict(spec)
        name = args.pop("name", None)
        where = f"task.transforms[{k}] ({name or 'no name'})"
        cls = getattr(transforms, name, None) if isinstance(name, str) else None
        if not (isinstance(cls, type) and issubclass(cls, transforms.MapTransform)):
            raise FedkitError(
                f"{where}: name must be a MONAI dictionary transform in monai.transforms "
                "(e.g. RandFlipd, RandRotate90d, RandGaussianNoised)"
            )
        try:
            steps.append(cls(keys=keys, **args))
        except Exception as err:  # MONAI's own check of the arguments, whatever it raises
            raise FedkitError(
                f"{where}: bad arguments {args}: {type(err).__name__}: {err}"
            ) from None
    return _batches(transforms.Compose(steps), segmentation)


def _batches(transform: Any, segmentation: bool) -> Augment:
    """``transform`` (a MONAI Compose of dictionary transforms) applied sample by sample to
    batches (N, C, *spatial), seeded from the caller's generator."""

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
