"""What hooks see: a client's context and the server's context.

None of these objects crosses between client and server; each party holds its own, and
each holds only its own statistics. Inside a hook, ``ctx.options()``, ``ctx.state`` and
``client.scratch`` belong to the plugin whose hook is running (under the name it was
registered with), so plugins never collide and never need to know their registered name.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from fedkit_core.config import Config
from fedkit_core.contract.channels import SAMPLE, dp_level
from fedkit_core.contract.data import SEGMENTATION, Batch, ClientData, ClientInfo, TaskInfo
from fedkit_core.contract.messages import Arrays, Payload
from fedkit_core.contract.scope import current_plugin
from fedkit_core.devices import autocast_forward, gather, input_layout
from fedkit_core.errors import FedkitError
from fedkit_core.losses import log_prior
from fedkit_core.metrics import classification_metrics, per_sample_dice, segmentation_metrics
from fedkit_core.models.fedmodel import FedModel


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (str parts hashed with crc32, not Python's hash)."""
    words = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return int(np.random.SeedSequence([abs(int(w)) for w in words]).generate_state(1)[0] >> 1)


def lr_at(config: Config, round: int) -> float:
    """The learning rate of a (1-based) round under the ``lr_schedule`` config keys."""
    lr, gamma = config["lr"], config["lr_gamma"]
    if config["lr_schedule"] == "step":
        return lr * gamma ** sum(round >= m for m in config["lr_milestones"])
    if config["lr_schedule"] == "exp":
        return lr * gamma ** (round - 1)
    return lr


T = TypeVar("T")


def batch_count(n: int, size: int, *, drop_last: bool = False, augment: bool = False) -> int:
    """How many batches :meth:`ClientContext.batches` makes of ``n`` samples: one per
    ``size`` samples, the trailing incomplete one dropped with ``drop_last``, and when
    training (``augment``) a trailing batch of one sample (batch norm cannot train on it).
    A client's local steps per epoch are ``batch_count(n, batch_size, augment=True)``."""
    full, rest = divmod(n, size)
    if rest == 0 or drop_last or (augment and rest == 1 and n > 1):
        return full
    return full + 1


def take_views(
    views: torch.Tensor, index: torch.Tensor, rng: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Samples ``index`` of a split's precomputed augmented ``views`` (V, N, ...), each
    from a view drawn from ``rng``, on ``device`` (see :class:`ClientData`)."""
    pick = torch.randint(len(views), (len(index),), generator=rng)
    return views[pick.to(views.device), index.to(views.device)].to(device, non_blocking=True)


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
    #: the learning rate of the current round (set by each fit message; 0 before the first)
    lr: float = 0.0
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

    def seed_round(self, round: int, trip: int | None = None) -> None:
        """Reseed every random stream of this client for ``round`` (keeps resume exact);
        ``trip`` numbers an asynchronous run's fits, of which a client may do several in
        one round."""
        self.round = round
        parts = (round, self.id) if trip is None else (round, self.id, "trip", trip)
        seed = derive_seed(self.config["seed"], *parts)
        torch.manual_seed(seed)
        self.rng = torch.Generator().manual_seed(seed)

    def forward(self, fn: Callable[[torch.Tensor], T], x: torch.Tensor) -> T:
        """``fn(x)`` (a model's forward pass) in the run's ``precision``: with ``bf16``
        under autocast, its floating outputs handed back as float32 so that losses and
        softmax are computed in float32 (see :mod:`fedkit_core.devices`)."""
        return autocast_forward(fn, x, self.config["precision"], self.device)

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
        incomplete trailing batch (:func:`batch_count` counts them). Images come in the
        run's layout (``channels_last``).
        """
        data = self.data[split]
        size = batch_size or self.config["batch_size"]
        n = len(data)
        order = torch.randperm(n, generator=self.rng) if shuffle else torch.arange(n)
        # the order moved where the data lives once per pass: indexing device data with a
        # host index copies it there and waits for the GPU, twice a batch otherwise
        images_at = order.to(data.images.device)
        targets_at = images_at.to(data.targets.device)
        count = batch_count(n, size, drop_last=drop_last, augment=augment)
        views = self.data.views.get(split) if augment else None
        for start in range(0, count * size, size):
            index = order[start : start + size]
            stop = start + len(index)
            if views is not None:
                x = self.data.normalizer(take_views(views, index, self.rng, self.device))
            else:
                x = self.data.normalizer(gather(data.images, images_at[start:stop], self.device))
            y = gather(data.targets, targets_at[start:stop], self.device).long()
            if augment and self.data.augment is not None:
                x, y = self.data.augment(x, y, self.rng)
            yield Batch(input_layout(x, self.config["channels_last"]), y, index)

    def train(
        self,
        params: Iterable[torch.nn.Parameter],
        epochs: int,
        *,
        forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
        lr: float | None = None,
        seed: int | None = None,
    ) -> float:
        """Train ``params`` alone for ``epochs`` passes over the training split on the task
        loss: a plugin's own phase of local training (FedRep's head epochs, FedBABU's
        fine-tuning before evaluation). Returns the mean loss.

        ``forward`` maps a batch's images to logits (default: the model's ``logits``), run
        in the run's precision (:meth:`forward`); the loss is :meth:`task_loss` of them
        (other plugins' loss terms do not apply). The
        optimiser is a fresh one of the run's kind (``fedkit_optimizer``) at ``lr``
        (default: this round's), with the run's ``grad_clip``. Modules keep the mode
        (train/eval) the caller set. With ``seed``, shuffling, augmentation and dropout draw
        from a stream of their own (reproducible at evaluation, when no round seeds them);
        otherwise from the round's streams.
        """
        params = list(params)
        if not params or epochs <= 0:
            return 0.0
        if dp_level(self.config) == SAMPLE:
            raise FedkitError(
                "a plugin trains with its own loop (ClientContext.train: FedRep's head, "
                "FedBABU's fine-tuning), which DP-SGD does not cover; run it without "
                "dp.level=sample"
            )
        rate = lr if lr is not None else (self.lr or self.config["lr"])
        groups = [{"params": params, "lr": rate, "lr_scale": 1.0}]
        optimizer = self.hook.fedkit_optimizer(client=self, param_groups=groups)
        forward = forward or (lambda x: self.model(x)["logits"])
        clip = self.config["grad_clip"]
        saved, total, steps = self.rng, torch.zeros((), device=self.device), 0
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices) if seed is not None else nullcontext():
            if seed is not None:
                torch.manual_seed(seed)
                self.rng = torch.Generator().manual_seed(seed)
            try:
                for _ in range(epochs):
                    for batch in self.batches("train", shuffle=True, augment=True):
                        loss = self.task_loss(batch, {"logits": self.forward(forward, batch.x)})
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        if clip:
                            torch.nn.utils.clip_grad_norm_(params, clip)
                        optimizer.step()
                        total += loss.detach()
                        steps += 1
            finally:
                self.rng = saved
        return float(total) / max(steps, 1)

    def score(self, split: str = "val", output: str = "logits") -> dict[str, float]:
        """The task's metrics (``bacc``, ``acc``... or ``dice``) of the model's ``output`` on
        one of this client's own splits, in eval mode without gradients; empty for an empty
        split. They stay on the client unless a plugin sends them (FedCE's leave-one-out
        score)."""
        model, segmentation = self.model, self.task.kind == SEGMENTATION
        was_training = model.training
        model.eval()
        parts: list[torch.Tensor] = []
        labels: list[torch.Tensor] = []
        try:
            with torch.inference_mode():
                for batch in self.batches(split, batch_size=self.config["eval_batch_size"]):
                    out = self.forward(model, batch.x)[output]
                    if segmentation:
                        parts.append(per_sample_dice(out, batch.y, self.task.num_classes).cpu())
                    else:
                        parts.append(F.softmax(out.float(), dim=1).cpu())
                        labels.append(batch.y.cpu())
        finally:
            model.train(was_training)
        if not parts:
            return {}
        if segmentation:
            return segmentation_metrics(torch.cat(parts).numpy(), self.task.class_names)
        return classification_metrics(
            torch.cat(parts).numpy(), torch.cat(labels).numpy(), self.task.shot_groups
        )
