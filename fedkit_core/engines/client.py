"""The client side of the protocol: one object per client, driven only by messages.

Every engine delivers the same four messages (``setup``, ``fit``, ``query``, ``evaluate``)
and gets the same replies, so plugins behave identically in-process and on Flower. The
client's persistent state (private model entries, optimiser state, plugin state) is
exported by :meth:`ClientRuntime.state_dict` for checkpoints and Flower's node state.

:class:`ClientRuntime` answers the messages and keeps the client's model; it hands the
jobs to small parts: the round's training and the optimiser kept between rounds
(:class:`~fedkit_core.engines.training.LocalTraining`, DP-SGD wired in there), what goes
up after training (:mod:`fedkit_core.engines.upload`), the evaluation
(:mod:`fedkit_core.engines.client_scoring`; a model shared by the clients of a process:
:mod:`fedkit_core.engines.shared`), idle clients (:mod:`fedkit_core.engines.pool`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from fedkit_core.allocator import keep_freed_memory
from fedkit_core.config import Config
from fedkit_core.contract.data import Batch, ClientData, TaskInfo
from fedkit_core.contract.messages import (
    Message,
    Payload,
    Reply,
    check_arrays,
    check_scalars,
    enclose,
    take_out,
)
from fedkit_core.contract.protocol import CLASS_COUNTS, EVALUATION, PAYLOAD
from fedkit_core.devices import place_model
from fedkit_core.engines.client_scoring import client_views, evaluated_chunks, evaluation_reply
from fedkit_core.engines.model import build_model
from fedkit_core.engines.pool import ModelPool
from fedkit_core.engines.shared import SharedModel
from fedkit_core.engines.training import LocalTraining
from fedkit_core.engines.trunk import OFF, TrunkCache, cache_mode
from fedkit_core.engines.upload import fit_reply, plugin_report
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext, derive_seed
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.privacy.checks import declared_channels
from fedkit_core.privacy.layer import is_private, privatised_channels


class ClientRuntime:
    """A client: its data and context, answering the server's messages."""

    def __init__(
        self,
        client_id: str,
        data: ClientData,
        task: TaskInfo,
        config: Config,
        plugins: PluginSet,
        device: torch.device,
        shared: SharedModel | None = None,
        pool: ModelPool | None = None,
    ):
        """``shared``: a model this client shares with others instead of building its own
        (see :func:`fedkit_core.engines.local.shared_model`); ``pool``: the live models of
        this client's process, when the client builds its model only when a message needs
        it and may idle as its snapshot (``local.live_models``, see
        :mod:`fedkit_core.engines.pool`); else it builds its model at set-up and keeps it.

        The process that holds clients trains them: its freed memory is kept for the next
        step (:func:`~fedkit_core.allocator.keep_freed_memory`, once per process)."""
        keep_freed_memory()
        self.plugins = plugins
        self.shared = shared
        self.pool = pool
        self.ctx = ClientContext(
            task, config, device, client_id=client_id, data=data, info=data.info()
        )
        self.ctx.hook = plugins.hook
        #: the round's training and the optimiser kept between rounds
        self.training = LocalTraining(self.ctx)
        self.dirty = False  # persistent state changed since the last state_dict()
        #: plugin scalars a private run may send (channels declared as privatised)
        self.privatised = (
            privatised_channels(declared_channels(plugins, self.ctx)) if is_private(config) else []
        )
        self.set_up = False  # whether the setup message succeeded
        mode = cache_mode(config, plugins)
        #: the frozen-trunk cache (``freeze_cache``), which ctx.data then holds
        self.trunk = TrunkCache(data, config, device, mode) if mode != OFF else None

    @property
    def id(self) -> str:
        return self.ctx.id

    @property
    def hook(self) -> Any:
        return self.plugins.hook

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The client's optimiser, when it has one (:class:`LocalTraining` keeps it)."""
        return self.training.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.training.optimizer = optimizer

    def handle(self, message: Message) -> Message:
        handler = {
            "setup": self.setup,
            "fit": self.fit,
            "query": self.query,
            "evaluate": self.evaluate,
        }
        if message.kind not in handler:
            raise ValueError(f"unknown message kind {message.kind!r}")
        return handler[message.kind](message)

    # ------------------------------------------------------------------ setup

    def setup(self, message: Message) -> Message:
        """Receive the server priors; build client priors and the model (once). The reply
        carries the client's class counts only when the run's shot groups need them."""
        ctx = self.ctx
        ctx.priors = dict(message.arrays)
        for priors in self.hook.fedkit_client_priors(client=ctx):
            ctx.priors.update(priors or {})
        self.set_up = False
        if self.shared is not None:
            ctx.model = self.shared.model
            self.shared.join(self)
        elif self.pool is not None:  # built by the first message that needs it
            self.pool.drop(self)
        else:
            ctx.model = self.new_model()
        self.frozen_inputs()
        self.set_up = True
        if ctx.config["task.shot_thresholds"]:
            return Message("setup", {CLASS_COUNTS: torch.tensor(ctx.info.class_counts)})
        return Message("setup")

    def new_model(self) -> FedModel:
        """This client's model as built at set-up (seeded per client: the same model
        whenever it is built)."""
        ctx = self.ctx
        torch.manual_seed(derive_seed(ctx.config["seed"], "model", ctx.id))
        return place_model(build_model(self.plugins, ctx), ctx.device, ctx.config["channels_last"])

    def live(self) -> None:
        """Make sure this client's model is built and holds its state (a client with a
        ``pool`` builds it when first needed and may have gone idle since)."""
        if self.pool is not None:
            self.pool.take(self)
            self.frozen_inputs()

    def frozen_inputs(self) -> None:
        """With the frozen-trunk cache, point ``ctx.data`` at this client's data as the
        model takes them (:meth:`TrunkCache.data_for`); call after the model's state may
        have changed."""
        if self.trunk is not None and self.ctx.model is not None:
            self.ctx.data = self.trunk.data_for(self.ctx.model)

    # ------------------------------------------------------------------ fit

    def fit(self, message: Message) -> Message:
        """Load the global arrays, train locally, return the shared arrays and scalars. A
        previous round's evaluation sent along (:data:`EVALUATION`, of the global arrays
        this message carries) is done first and its reply goes back with the fit's."""
        message, evaluation = take_out(message, EVALUATION, "evaluate")
        # the global arrays and the round's settings; the plugins' entries
        message, payload = take_out(message, PAYLOAD, "fit")
        if not evaluation.scalars:
            return self._fit(message, payload)
        scored = self.evaluate(Message("evaluate", message.arrays, evaluation.scalars))
        return enclose(self._fit(message, payload), scored, EVALUATION)

    def _fit(self, message: Message, payload: Message) -> Message:
        self.live()
        ctx = self.ctx
        round_, lr = int(message.scalars["round"]), float(message.scalars["lr"])
        trip = message.scalars.get("trip")  # asynchronous aggregation's dispatches
        ctx.seed_round(round_, None if trip is None else int(trip))
        ctx.lr = lr
        ctx.scratches.clear()
        ctx.received = Payload(payload.arrays, payload.scalars)
        ctx.model.load_shared(message.arrays)
        self.frozen_inputs()
        self.hook.fedkit_round_start(client=ctx)
        optimizer = self._optimizer(lr)
        scalars, dp_report = self.training.round(
            optimizer, round_, lambda: self.train_passes(message)
        )
        reported, extras = plugin_report(ctx)
        scalars.update(reported)
        self.dirty = True
        return fit_reply(ctx, message, scalars, extras, dp_report, self.privatised)

    def _optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The client's optimiser with every group's learning rate set to this round's
        (:meth:`LocalTraining.optimiser`)."""
        return self.training.optimiser(lr)

    def train_passes(self, message: Message) -> Iterator[Iterable[Batch]]:
        """The batches of one round's local training, pass by pass: ``local_epochs``
        shuffled, augmented epochs over the client's training split (the pooled reference's
        trainer draws another number of steps, see :mod:`fedkit_core.engines.pooled`)."""
        for _ in range(self.ctx.config["local_epochs"]):
            yield self.ctx.batches("train", shuffle=True, augment=True)

    # ------------------------------------------------------------------ query

    def query(self, message: Message) -> Message:
        """An extra round trip during aggregation, answered by the plugin that asked."""
        self.live()
        scalars = dict(message.scalars)
        name = str(scalars.pop("query"))
        reply = self.hook.fedkit_answer_query(
            client=self.ctx, query=name, arrays=message.arrays, scalars=scalars
        )
        if not isinstance(reply, Reply):
            raise FedkitError(f"no active plugin answers the query {name!r}")
        self.dirty = True
        return Message(
            "query",
            check_arrays(reply.arrays, f"reply to {name}"),
            check_scalars(reply.scalars, f"reply to {name}"),
        )

    # ------------------------------------------------------------------ evaluate

    def evaluate(self, message: Message) -> Message:
        """Evaluate every view on the requested splits (the reply:
        :mod:`fedkit_core.engines.client_scoring`); with a shared model, every member at once."""
        ctx = self.ctx
        self.live()
        ctx.round = int(message.scalars.get("round", ctx.round))
        if self.shared is not None:
            return self.shared.evaluate(self, message)
        ctx.model.load_shared(message.arrays)
        self.frozen_inputs()
        views, served = client_views(ctx)
        chunks = evaluated_chunks(ctx, views, str(message.scalars["splits"]))
        return evaluation_reply(ctx, message, views, served, chunks)

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """The client's persistent state: private model entries, optimiser, plugin state,
        the current round's plugin scratch (needed by queries after a fit), and which
        parameters train (a kept optimiser holds those: FedRep freezes its head)."""
        self.live()
        self.dirty = False
        return {
            "private": self.ctx.model.private_state(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "plugins": self.ctx.states,
            "scratch": self.ctx.scratches,
            "trainable": {n: p.requires_grad for n, p in self.ctx.model.named_parameters()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.live()
        model = self.ctx.model
        model.load_private(state["private"])
        self.frozen_inputs()
        for name, param in model.named_parameters():  # before the optimiser is rebuilt
            param.requires_grad_(state.get("trainable", {}).get(name, param.requires_grad))
        self.ctx.states = {k: dict(v) for k, v in state["plugins"].items()}
        self.ctx.scratches = {k: dict(v) for k, v in state.get("scratch", {}).items()}
        if state["optimizer"] is not None:
            self._optimizer(self.ctx.config["lr"]).load_state_dict(state["optimizer"])
