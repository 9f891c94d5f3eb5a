"""Your own per-client data from Python: arrays or datasets held in memory become a task.

>>> from fedkit_core.tasks.memory import register_clients
>>> register_clients("my-hospitals", {
...     "hospital-a": {"train": (x_a, y_a), "test": (xt_a, yt_a)},
...     "hospital-b": {"train": train_b},          # a torch Dataset of (image, label)
... }, class_names=["normal", "pneumonia"])
>>> fedkit_core.run({"task": "my-hospitals", "model": "my_module:my_net", "rounds": 5})

Each key is a client (``partition.kind=sites`` by default); ``val`` and ``test`` are
optional (carved from train by ``task.val_fraction`` / ``task.test_fraction``). A split is
``(images, labels)`` (numpy arrays or tensors; images (N, H, W), (N, C, H, W) or
(N, C, D, H, W), uint8 0-255 or float already scaled; labels (N,) class labels or label
masks for ``kind="segmentation"``) or a map-style dataset yielding ``(image, label)``.
The data lives in this process: the ``local`` engine runs it; the model is any
``model=module:factory`` (a factory in the calling script is ``__main__:factory``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedkit_core.contract.data import CLASSIFICATION, SEGMENTATION, Split, TaskData, classes_up_to
from fedkit_core.errors import FedkitError
from fedkit_core.tasks.registry import register_task
from fedkit_core.tasks.spec import TaskSpec

#: a split as given: (images, labels) or a dataset of (image, label) pairs
SplitLike = Any


def register_clients(
    name: str,
    clients: Mapping[str, Mapping[str, SplitLike]],
    class_names: Sequence[str] | None = None,
    kind: str = CLASSIFICATION,
    description: str = "",
) -> TaskSpec:
    """Register the task ``name`` serving ``clients`` (client -> split -> data); ``--task
    name`` / ``{"task": name}`` then runs it. Class names default to ``class0``, ... up to
    the largest label. Returns the task's spec."""
    if kind not in (CLASSIFICATION, SEGMENTATION):
        raise FedkitError(f"kind must be {CLASSIFICATION!r} or {SEGMENTATION!r}, not {kind!r}")
    sites = {
        str(client): {
            split: _split(data, kind, f"client {client!r}, split {split!r}")
            for split, data in splits.items()
        }
        for client, splits in clients.items()
    }
    if not sites:
        raise FedkitError("register_clients needs at least one client")
    names = list(class_names) if class_names is not None else _default_names(sites)

    def load(config: Any) -> TaskData:  # a fresh TaskData: loading resizes and normalises it
        return TaskData(kind, names, dict(sites), has_sites=len(sites) > 1)

    spec = TaskSpec(
        name=name,
        description=description or f"in-memory data of {len(sites)} client(s)",
        kind=kind,
        loader=load,
    )
    return register_task(spec)


def _split(data: SplitLike, kind: str, where: str) -> Split:
    if isinstance(data, tuple) and len(data) == 2:
        images, labels = data
    elif hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        pairs = [data[i] for i in range(len(data))]
        if not pairs:
            raise FedkitError(f"{where}: the dataset is empty")
        images = torch.stack([torch.as_tensor(np.asarray(x)) for x, _ in pairs])
        labels = torch.stack([torch.as_tensor(np.asarray(y)) for _, y in pairs])
    else:
        raise FedkitError(f"{where}: expected (images, labels) or a dataset, got {type(data)}")
    images, labels = torch.as_tensor(np.asarray(images)), torch.as_tensor(np.asarray(labels))
    if images.dim() == 3:  # (N, H, W): one channel
        images = images[:, None]
    if images.dtype != torch.uint8:
        images = images.float()
    if kind == CLASSIFICATION and labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels.reshape(-1)  # (N, 1), as MedMNIST stores them
    if labels.is_floating_point() and not torch.equal(labels, labels.round()):
        raise FedkitError(f"{where}: labels must be integers, got values such as {labels[:3]}")
    try:
        return Split(images, labels.long())
    except ValueError as err:  # different lengths
        raise FedkitError(f"{where}: {err}") from None


def _default_names(sites: Mapping[str, Mapping[str, Split]]) -> list[str]:
    top = max(int(s.targets.max()) for splits in sites.values() for s in splits.values() if len(s))
    return [f"class{c}" for c in range(max(2, classes_up_to(top, "the task's labels")))]
