"""A federation before its first round: the task's data split into clients, described.

Every engine starts from here (the local engine in one process; each Flower node for its
own client), so data loading, partitioning, shot groups and the device are the same on all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.errors import FedkitError
from fedkit_core.partitions import partition
from fedkit_core.plugins import PluginSet
from fedkit_core.tasks.base import CLASSIFICATION, ClientData, ClientInfo, TaskInfo
from fedkit_core.tasks.loading import load_task


def pick_device(name: str) -> torch.device:
    """The torch device for ``device=name`` (``auto``: the GPU when there is one).

    On a GPU, cuDNN is set to deterministic algorithms, in every engine's server and clients
    alike, so that a seed gives the same run.
    """
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise FedkitError(f"device={name!r} is not a torch device: {err}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise FedkitError("device=cuda was asked for but no CUDA GPU is available")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return device


@dataclass
class Federation:
    """Everything a run needs before its first round: config, plugins, data, clients."""

    config: Config
    plugins: PluginSet
    task: TaskInfo
    clients: dict[str, ClientData]
    device: torch.device


def prepare(config: Config, plugins: PluginSet) -> Federation:
    """Load and partition the task's data and describe it."""
    data = load_task(config)
    clients = partition(data, config)
    infos = [c.info() for c in clients.values()]
    shot_groups = shot_groups_of(config, data.kind, infos, data.shot_groups)
    sample = data.sample_split().images
    task = TaskInfo(
        name=config["task.name"],
        kind=data.kind,
        class_names=list(data.class_names),
        in_channels=int(sample.shape[1]),
        image_shape=tuple(int(s) for s in next(iter(clients.values()))["train"].images.shape[2:]),
        clients={cid: c.info() for cid, c in clients.items()},
        shot_groups=shot_groups,
    )
    return Federation(config, plugins, task, clients, pick_device(config["device"]))


def shot_groups_of(
    config: Config,
    kind: str,
    clients: Sequence[ClientInfo],
    default: dict[str, list[int]] | None,
) -> dict[str, list[int]] | None:
    """Head/medium/tail classes from ``task.shot_thresholds`` and the clients' pooled
    training counts (the task's own groups when no thresholds are set)."""
    thresholds = config["task.shot_thresholds"]
    if not thresholds or kind != CLASSIFICATION:
        return default
    if len(thresholds) != 2:
        raise FedkitError("task.shot_thresholds must be [many, few]")
    counts = sum(np.asarray(c.class_counts) for c in clients)
    many, few = thresholds
    return {
        "head": [c for c, n in enumerate(counts) if n > many],
        "medium": [c for c, n in enumerate(counts) if few <= n <= many],
        "tail": [c for c, n in enumerate(counts) if n < few],
    }
