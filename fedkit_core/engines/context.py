"""What hooks see: a client's context, the server's context and a model-building context.

None of these objects crosses between client and server; each party holds its own.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.losses import log_prior
from fedkit_core.messages import Arrays
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.tasks.base import Batch, ClientData, ClientInfo, TaskInfo


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (str parts hashed with crc32, not Python's hash)."""
    words = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return int(np.random.SeedSequence([abs(int(w)) for w in words]).generate_state(1)[0] >> 1)


@dataclass
class ModelContext:
    """Who a model is built for: the server (``client_id is None``) or one client."""

    task: TaskInfo
    config: Config
    client_id: str | None = None
    priors: Mapping[str, Any] = field(default_factory=dict)

    @property
    def client(self) -> ClientInfo | None:
        return self.task.clients.get(self.client_id) if self.client_id is not None else None


@dataclass
class ClientContext:
    """One client as its hooks see it: its data, model, priors and private state.

    ``state`` persists across rounds, never leaves the client, and is checkpointed with it
    (keep tensors and plain Python values there; use ``plugin_state(name)`` for a namespace).
    ``priors`` holds the server priors and the client priors; it is rebuilt, not checkpointed.
    """

    id: str
    task: TaskInfo
    config: Config
    data: ClientData
    device: torch.device
    priors: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    model: FedModel | None = None
    round: int = 0
    rng: torch.Generator = field(default_factory=torch.Generator)
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def class_counts(self) -> np.ndarray:
        """Training samples per class (pixels per class for segmentation)."""
        if "counts" not in self._cache:
            self._cache["counts"] = self.data["train"].class_counts(self.task.num_classes)
        return self._cache["counts"]

    def log_prior(self, eps: float = 1e-12) -> torch.Tensor:
        """``log(n_c / n + eps)`` of the client's training labels, on its device (for BSM)."""
        key = ("log_prior", eps)
        if key not in self._cache:
            self._cache[key] = log_prior(self.class_counts, eps).to(self.device)
        return self._cache[key]

    def options(self, plugin: str) -> dict[str, Any]:
        """The config options of ``plugin`` (without the ``plugin.`` prefix)."""
        return self.config.section(plugin)

    def plugin_state(self, plugin: str) -> dict[str, Any]:
        return self.state.setdefault(plugin, {})

    def seed_round(self, round: int) -> None:
        """Reseed every random stream of this client for ``round`` (keeps resume exact)."""
        self.round = round
        seed = derive_seed(self.config["seed"], round, self.id)
        torch.manual_seed(seed)
        self.rng = torch.Generator().manual_seed(seed)

    def batches(
        self,
        split: str = "train",
        *,
        shuffle: bool = False,
        batch_size: int | None = None,
        augment: bool = False,
        drop_last: bool = False,
    ) -> Iterator[Batch]:
        """Iterate over a split in batches on the client's device.

        Shuffling draws from ``self.rng`` (seeded per round). A trailing batch of one sample
        is dropped when training (batch norm cannot train on it); ``drop_last`` drops any
        incomplete trailing batch.
        """
        data = self.data[split]
        size = batch_size or self.config["batch_size"]
        n = len(data)
        order = torch.randperm(n, generator=self.rng) if shuffle else torch.arange(n)
        for start in range(0, n, size):
            index = order[start : start + size]
            if (drop_last and len(index) < size) or (augment and len(index) == 1 and n > 1):
                break
            x = self.data.normalizer(data.images[index].to(self.device, non_blocking=True))
            y = data.targets[index].to(self.device, non_blocking=True).long()
            if augment and self.data.augment is not None:
                x, y = self.data.augment(x, y, self.rng)
            yield Batch(x, y, index)


@dataclass
class ServerContext:
    """The server as its hooks see it. ``state`` persists across rounds and is checkpointed."""

    task: TaskInfo
    config: Config
    device: torch.device
    global_state: Arrays = field(default_factory=dict)
    priors: dict[str, torch.Tensor] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    round: int = 0

    def options(self, plugin: str) -> dict[str, Any]:
        return self.config.section(plugin)
