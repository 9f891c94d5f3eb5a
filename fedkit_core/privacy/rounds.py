"""Privacy as wrappers around a round's strategy (:mod:`fedkit_core.engines.strategy`).

As Flower's ``DifferentialPrivacyServerSideFixedClipping(strategy)`` wraps any strategy,
:class:`DifferentialPrivacy` and :class:`SecureAggregation` wrap the strategy a round mode
asks, answering its questions their way (the secret sample, the clipping norm in the fit
message, the privatised update, the accountant's round record and last round, what a
record may name) and handing every other question to the strategy they wrap. The loop and
the round modes never ask whether a run is private. The mechanism itself is
:class:`~fedkit_core.privacy.layer.ServerPrivacy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedkit_core.config import Config
from fedkit_core.contract.messages import Message, Update, message_bytes
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ServerContext
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.privacy.checks import declared_channels
from fedkit_core.privacy.layer import (
    ALL_CLIENTS,
    ServerPrivacy,
    hides_sampling,
    private_scalars,
    privatised_channels,
)


def private(
    strategy: Any, config: Config, plugins: PluginSet, ctx: ServerContext, simulated: bool
) -> Any:
    """``strategy`` wrapped in the privacy the run's config asks for (as it is without).
    ``simulated``: the run keeps simulated time, whose outages say which sites trained."""
    privacy = ServerPrivacy(config, len(ctx.task.client_ids))
    if privacy.active:
        privacy.allowed = privatised_channels(declared_channels(plugins, ctx))
        if hides_sampling(config) and simulated:
            raise FedkitError(
                "sites (simulated time) cannot run with dp.level=client at sample_fraction < "
                "1: each round's simulated time and outages say which sites trained, and the "
                "epsilon is amplified on that sampling being secret; use sample_fraction=1 "
                "or leave sites unset"
            )
    if privacy.active or config["secagg.enabled"]:
        strategy = DifferentialPrivacy(strategy, privacy, hides_sampling(config))
    if config["secagg.enabled"]:
        strategy = SecureAggregation(strategy, privacy)
    return strategy


class Wrapper:
    """A strategy that answers as the one it wraps (``inner``) unless it says otherwise."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being made): no delegation
            raise AttributeError(name)
        return getattr(self.inner, name)


class DifferentialPrivacy(Wrapper):
    """The privacy layer's answers (:class:`ServerPrivacy`; with ``dp.level=none`` only its
    refusal of queries and the record-safe scalars); ``hidden``: the sampling is secret, so
    no record may name the sampled clients."""

    def __init__(self, inner: Any, privacy: ServerPrivacy, hidden: bool):
        super().__init__(inner)
        self.privacy, self.hidden = privacy, hidden

    @property
    def state(self) -> dict[str, Any]:
        """The layer's state in the server's context (checkpointed with it)."""
        return self.inner.ctx.states.setdefault("dp", {})

    @property
    def last_round(self) -> int:
        return self.privacy.last_round

    def select(self, clients: Sequence[str], rnd: int) -> list[str]:
        sampled = self.privacy.sample(clients, rnd)
        return self.inner.select(clients, rnd) if sampled is None else sampled

    def fit_scalars(self) -> dict[str, Any]:
        return {**self.inner.fit_scalars(), **self.privacy.fit_scalars(self.state)}

    def updates(self, replies: Mapping[str, Message], ok: Sequence[str], rnd: int) -> list[Update]:
        updates = self.inner.updates(replies, ok, rnd)
        return self.privacy.updates(self.inner.ctx.global_state, updates, self.state, rnd)

    def check_query(self, query: str) -> None:
        self.privacy.check_query(query)

    def train_record(
        self, sampled: Sequence[str], ok: Sequence[str], replies: Mapping[str, Message]
    ) -> dict[str, Any]:
        if self.hidden:  # the count only: the names would undo the amplification by sampling
            return {"sampled_count": len(sampled), "trained_count": len(ok)}
        return self.inner.train_record(sampled, ok, replies)

    def reported(self, scalars: Mapping[str, Any]) -> dict[str, Any]:
        return self.inner.reported(private_scalars(scalars))

    def traffic(self, traffic: dict[str, dict[str, int]]) -> dict[str, Any]:
        if not self.hidden:
            return self.inner.traffic(traffic)
        # one total: each client's bytes say whether it trained
        return {ALL_CLIENTS: {w: sum(c[w] for c in traffic.values()) for w in ("down", "up")}}

    def round_record(self, rnd: int) -> dict[str, Any]:
        entry = self.privacy.record(rnd, self.state)
        return {**self.inner.round_record(rnd), **({} if entry is None else {"privacy": entry})}

    def is_last(self, rnd: int) -> bool:
        return self.privacy.last(rnd, self.state)

    def summary(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        return self.privacy.summary(records, self.inner.ctx.states.get("dp", {}))

    def restore(self) -> None:
        self.inner.restore()
        self.privacy.restore(self.inner.ctx.states.get("dp", {}))


class SecureAggregation(Wrapper):
    """The fit exchange through the transport's SecAgg+ (see
    :mod:`fedkit_core.engines.flower.secure`): the server gets each client's reply scalars and the
    weighted mean of their updates, which the privacy layer turns into the one update the
    aggregator sees (privatised under client-level DP). It wraps :class:`DifferentialPrivacy`
    and answers for the updates in its place: the sum is all there is."""

    carries_evaluation = False  # an evaluation cannot travel inside SecAgg+'s stages

    def __init__(self, inner: DifferentialPrivacy, privacy: ServerPrivacy):
        super().__init__(inner)
        self.privacy = privacy
        self.summed: Message | None = None

    def fit(
        self, exchange: Any, transport: Any, messages: dict[str, Message], rnd: int
    ) -> dict[str, Message]:
        secure = getattr(transport, "secure_fit", None)
        if secure is None:
            raise FedkitError("this engine's transport cannot aggregate securely (secagg.enabled)")
        ctx = self.inner.ctx
        replies, self.summed = secure(messages, rnd, ctx.config, ctx.global_state)
        for cid, message in messages.items():
            counts = exchange.traffic.setdefault(cid, {"down": 0, "up": 0})
            counts["down"] += message_bytes(message)
            counts["up"] += message_bytes(self.summed) if replies[cid].error is None else 0
        return replies

    def updates(self, replies: Mapping[str, Message], ok: Sequence[str], rnd: int) -> list[Update]:
        ok_replies = {cid: replies[cid] for cid in ok}
        summed, self.summed = self.summed, None
        return self.privacy.secure_updates(
            self.inner.ctx.global_state, summed, ok_replies, self.inner.state, rnd
        )
