"""What hooks see: a client's context and the server's context.

None of these objects crosses between client and server; each party holds its own, and
each holds only its own statistics. Inside a hook, ``ctx.options()``, ``ctx.state`` and
``client.scratch`` belong to the plugin whose hook is running (under the name it was
registered with), so plugins never collide and never need to know their registered name.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.errors import FedkitError
from fedkit_core.losses import log_prior
from fedkit_core.messages import Arrays, Payload
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.plugins import current_plugin
from fedkit_core.tasks.base import Batch, ClientData, ClientInfo, TaskInfo


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (str parts hashed with crc32, not Python's hash)."""
    words = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return int(np.random.SeedSequence([abs(int(w)) for w in words]).generate_state(1)[0] >> 1)


def _caller(what: str) -> str:
    name = current_plugin()
    if name is None:
        raise FedkitError(
            f"{what} is a plugin's own and is only available inside its hooks "
            "(tests calling a hook directly: `with fedkit_core.plugin.plugin_scope(NAME):`)"
        )
    return name


@dataclass
class _Party:
    """What both sides have: the task, the config, priors, and per-plugin state."""

    task: TaskInfo
    config: Config
    device: torch.device
    priors: dict[str, Any] = field(default_factory=dict)
    round: int = 0
    #: per-plugin state kept across rounds and checkpointed: {plugin name: {...}}
    states: dict[str, dict[str, Any]] = field(default_factory=dict)

    client_id: str | None = None

    @property
    def is_client(self) -> bool:
        return self.client_id is not None

    def options(self, plugin: str | None = None) -> dict[str, Any]:
        """The config options of the calling plugin (or of ``plugin``), without its prefix."""
        return self.config.section(plugin or _caller("ctx.options()"))

    @property
    def state(self) -> dict[str, Any]:
        """The calling plugin's state: kept across rounds, checkpointed, never sent.
        Keep tensors and plain Python values here."""
        return self.states.setdefault(_caller("ctx.state"), {})


@dataclass
class ServerContext(_Party):
    """The server as its hooks see it: the global state, server priors, plugin state.

    ``task`` describes the task and lists the client ids, nothing of their data.
    """

    global_state: Arrays = field(default_factory=dict)


@dataclass
class ClientContext(_Party):
    """One client as its hooks see it: its data and own statistics, model, priors, state.

    ``state`` persists across rounds, never leaves the client, and is checkpointed with it.
    ``scratch`` holds what one round needs (from ``fedkit_round_start`` to the queries of
    the same round) and is emptied when the next round starts. ``received`` is what the
    plugins' :func:`fedkit_configure_fit` sent with this round's fit message. ``priors``
    holds the server priors and the client priors; it is rebuilt, not checkpointed.
    """

    data: ClientData | None = None
    info: ClientInfo | None = None
    model: FedModel | None = None
    rng: torch.Generator = field(default_factory=torch.Generator)
    received: Payload = field(default_factory=Payload)
    scratches: dict[str, dict[str, Any]] = field(default_factory=dict)
    hook: Any = field(default=None, repr=False)
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        assert self.client_id is not None
        return self.client_id

    @property
    def scratch(self) -> dict[str, Any]:
        """The calling plugin's per-round values (emptied when the next round starts)."""
        return self.scratches.setdefault(_caller("client.scratch"), {})

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

    def task_loss(self, batch: Batch, outputs: Mapping[str, Any]) -> torch.Tensor:
        """The task loss of ``outputs`` through the hook chain (whichever plugin owns it)."""
        return self.hook.fedkit_task_loss(client=self, batch=batch, outputs=outputs)

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
