"""The data model of a task: splits, per-site data, client data and the task's description.

A task loader returns a :class:`TaskData` (images and targets per site and split, as
in-memory tensors). A partitioner turns it into one :class:`ClientData` per client. The
description every party may know (classes, channels, client sizes) is a :class:`TaskInfo`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from fedkit_core.errors import FedkitError

CLASSIFICATION = "classification"
SEGMENTATION = "segmentation"
SPLITS = ("train", "val", "test")

#: the most classes a task may have: a stray label of 10**9 is an error, not gigabytes of
#: per-class counts
MAX_CLASSES = 10_000


def classes_up_to(top: int, where: str) -> int:
    """The number of classes of labels ``0 .. top``, refused above :data:`MAX_CLASSES`."""
    if top >= MAX_CLASSES:
        raise FedkitError(
            f"{where}: the largest label is {top}, i.e. {top + 1} classes; fedkit supports up to "
            f"{MAX_CLASSES} (labels are class numbers 0, 1, ...; masks hold class numbers, "
            "not grey levels)"
        )
    return top + 1


def compact_targets(targets: torch.Tensor) -> torch.Tensor:
    """Class labels as int64; label masks as uint8 when every label lies in 0..255."""
    targets = targets.contiguous()
    if targets.dim() <= 1:
        return targets.long()
    fits = targets.numel() and int(targets.min()) >= 0 and int(targets.max()) < 256
    return targets.to(torch.uint8) if fits else targets


@dataclass
class Split:
    """Images and targets of one split, in memory.

    ``images``: (N, C, H, W) or (N, C, D, H, W), uint8 (0-255) or float (already scaled).
    ``targets``: (N,) class labels, int64, or (N, H, W) / (N, D, H, W) label masks, stored
    as uint8 when their labels fit (8x less memory); batches hand out int64 either way.
    """

    images: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.images) != len(self.targets):
            raise ValueError(f"{len(self.images)} images but {len(self.targets)} targets")
        # plain tensors only: a subclass such as MONAI's MetaTensor (what MONAI transforms
        # return) routes every later operation through Python and slows training severalfold
        self.images = self.images.as_subclass(torch.Tensor)
        self.targets = self.targets.as_subclass(torch.Tensor)
        # one memory layout whatever the loader produced (decoded HWC images are channels-last
        # views): convolutions then compute the same numbers from a fresh load and from the cache
        self.images = self.images.contiguous()
        self.targets = compact_targets(self.targets)

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, index: np.ndarray | torch.Tensor) -> Split:
        index = torch.as_tensor(np.asarray(index), dtype=torch.long)
        return Split(self.images[index], self.targets[index])

    def subsets(self, indices: Sequence[np.ndarray]) -> list[Split]:
        """``[self.subset(i) for i in indices]`` as views of one gathered copy: one
        indexing operation whatever the number of parts (a thousand clients' splits would
        otherwise be thousands of small copies, each a torch call, slow on a loaded
        machine)."""
        sizes = [len(i) for i in indices]
        flat = [np.asarray(i, dtype=np.int64).reshape(-1) for i in indices]
        whole = self.subset(np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64))
        bounds = np.cumsum([0, *sizes]).tolist()
        return [Split(whole.images[a:b], whole.targets[a:b]) for a, b in zip(bounds, bounds[1:])]

    @staticmethod
    def concat(splits: Sequence[Split]) -> Split:
        return Split(torch.cat([s.images for s in splits]), torch.cat([s.targets for s in splits]))

    def class_counts(self, num_classes: int) -> np.ndarray:
        """Samples per class (classification) or pixels per class (segmentation)."""
        labels = self.targets.reshape(-1).cpu().numpy()  # held on a GPU: data_on_device
        return np.bincount(labels, minlength=num_classes)[:num_classes]


@dataclass
class Normalizer:
    """Turns stored images into model input: scale uint8 to [0, 1], then standardise."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    #: (device, dims) -> the broadcastable mean and std tensors, made once per device (on a
    #: GPU each would be a blocking host-to-device copy per batch)
    _tensors: dict[Any, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float()
        if images.dtype == torch.uint8:
            x = x / 255.0
        mean, std = self._statistics(x)
        return (x - mean) / std

    def invert(self, x: torch.Tensor) -> torch.Tensor:
        """Undo the normalisation: images back in [0, 1] (uint8 data) or at their stored
        scale (float data), in ``x``'s dtype."""
        mean, std = self._statistics(x)
        return x * std.to(x.dtype) + mean.to(x.dtype)

    def _statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and std, shaped to broadcast over ``x``, on its device (made once)."""
        key = (x.device, x.dim())
        if key not in self._tensors:
            shape = (1, -1) + (1,) * (x.dim() - 2)
            self._tensors[key] = (
                torch.tensor(self.mean, device=x.device).view(shape),
                torch.tensor(self.std, device=x.device).view(shape),
            )
        return self._tensors[key]


Augment = Callable[
    [torch.Tensor, torch.Tensor, torch.Generator], "tuple[torch.Tensor, torch.Tensor]"
]


@dataclass
class TaskData:
    """What a task loader returns.

    ``sites`` maps a site name to its splits (``train`` required; ``val`` / ``test``
    optional, carved from ``train`` when absent). Data without natural sites uses one
    entry and ``has_sites=False``; partitioners then pool and split it.
    """

    kind: str
    class_names: list[str]
    sites: dict[str, dict[str, Split]]
    has_sites: bool = True
    normalizer: Normalizer | None = None
    shot_groups: dict[str, list[int]] | None = None
    augment: Augment | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def pooled(self, split: str) -> Split | None:
        parts = [s[split] for s in self.sites.values() if split in s and len(s[split])]
        return Split.concat(parts) if parts else None

    def sample_split(self) -> Split:
        return next(iter(self.sites.values()))["train"]


@dataclass
class ClientInfo:
    """A client's own statistics: its id, split sizes and training class counts. Only the
    client itself (and a simulation harness holding all the data) has it."""

    id: str
    num_train: int
    num_val: int
    num_test: int
    class_counts: list[int]


@dataclass
class TaskInfo:
    """The task's description, shared by server and clients (JSON-serialisable).

    It names the clients but holds none of their statistics (sizes, class counts): each
    client knows only its own (:class:`ClientInfo`).
    """

    name: str
    kind: str
    class_names: list[str]
    in_channels: int
    image_shape: tuple[int, ...]
    client_ids: list[str] = field(default_factory=list)
    shot_groups: dict[str, list[int]] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def spatial_dims(self) -> int:
        return len(self.image_shape)

    @property
    def main_metric(self) -> str:
        return "dice" if self.kind == SEGMENTATION else "bacc"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["image_shape"] = list(self.image_shape)
        out["main_metric"] = self.main_metric
        return out

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> TaskInfo:
        data = dict(data)
        data.pop("main_metric", None)
        data["image_shape"] = tuple(data["image_shape"])
        return TaskInfo(**data)


@dataclass
class ClientData:
    """One client's private splits, as produced by a partitioner.

    ``views``: precomputed augmented copies of a split's images, (V, N, ...) (the
    frozen-trunk cache's, :mod:`fedkit_core.engines.trunk`): an augmented batch of that
    split takes each sample from one of them, drawn at random, instead of calling
    ``augment``.
    """

    id: str
    splits: dict[str, Split]
    num_classes: int
    normalizer: Normalizer
    augment: Augment | None = None
    views: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, split: str) -> Split:
        return self.splits[split]

    def info(self) -> ClientInfo:
        return ClientInfo(
            id=self.id,
            num_train=len(self.splits["train"]),
            num_val=len(self.splits["val"]),
            num_test=len(self.splits["test"]),
            class_counts=[int(c) for c in self.splits["train"].class_counts(self.num_classes)],
        )


@dataclass
class Batch:
    """One batch on the training device. ``index``: positions of its samples in the split."""

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)
