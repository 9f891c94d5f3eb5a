"""Asynchronous aggregation: FedBuff and FedAsync rounds, on any engine.

``aggregation=fedbuff`` (Nguyen et al. 2022, buffered asynchronous aggregation): up to
``async.concurrency`` clients train at once, each on the global model of the moment it was
sent; as soon as one replies another idle client is sent the current model. Each update's
change ``x_k - x_v`` (from the version ``v`` it trained on) is weighted by its staleness
``s`` (server updates since ``v``: ``(1 + s)^-a``, FedBuff's ``1/sqrt(1 + s)`` at ``a =
0.5``) and buffered; every ``async.buffer`` updates the server applies the buffer.
``aggregation=fedasync`` (Xie et al. 2019): every update is mixed in as it arrives,
``x <- (1 - w) x + w x_k`` with ``w = async.alpha * (1 + s)^-a``.

Both go through the method's own ``fedkit_aggregate``: each update is handed over rebased on
the current global state (FedBuff: ``x + w_k (x_k - x_v)``; FedAsync: the mix), so the
built-in FedAvg gives exactly the rules above (FedBuff's buffer weighted by
``num_examples``) and a plugin's aggregator applies its own weighting to them. That holds
only for aggregators that combine updates and nothing else: :func:`fedkit_core.rules.check_aggregation`
refuses plugins that answer queries (an extra round trip that needs every client of one
round, such as Fed-LWR's) or whose aggregation has not declared ``fedkit_asynchronous =
True``, with the reason (a plugin may also declare a text: its own reason).

A round is as many client updates as a synchronous round samples (``sample_fraction``), so
``rounds`` means the same work in every mode. Replies come in the order of their arrival:
in simulated time (:class:`VirtualChannel`, the clock of :mod:`fedkit_core.engines.clock`;
replies are computed when sent and kept until their simulated arrival, ties broken by
the order they were sent), or in real time on a Flower deployment
(:class:`RealtimeChannel`). Everything the schedule holds between rounds (the buffer, the
models in flight and their replies) is in the server's checkpoint, so a resumed run ends
as an uninterrupted one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.messages import Arrays, Message, Update
from fedkit_core.contract.options import Option
from fedkit_core.engines.clock import Clock
from fedkit_core.engines.exchange import Exchange, Transport
from fedkit_core.engines.rounds import Federation, RoundMode
from fedkit_core.errors import ClientFailure, FedkitError
from fedkit_core.hooks.context import derive_seed

#: the fit message's scalar that numbers a client's dispatches (its training is seeded by it)
TRIP = "trip"

#: the options of the asynchronous modes
ASYNC_OPTIONS = (
    Option(
        "async.concurrency",
        int,
        None,
        "fedbuff/fedasync: clients training at once (default: the clients a sync round samples)",
        min=1,
    ),
    Option(
        "async.buffer",
        int,
        None,
        "fedbuff: updates buffered per server update (default: async.concurrency)",
        min=1,
    ),
    Option("async.server_lr", float, 1.0, "fedbuff: server learning rate", gt=0),
    Option("async.alpha", float, 0.6, "fedasync: weight of an update mixed in", gt=0, max=1.0),
    Option(
        "async.staleness",
        str,
        "polynomial",
        "weight of an update by its staleness s (server updates since its model): "
        "polynomial (1 + s)^-a, or constant",
        choices=("polynomial", "constant"),
    ),
    Option("async.exponent", float, 0.5, "a of the polynomial staleness weight", min=0.0),
    Option(
        "async.max_staleness",
        int,
        None,
        "drop updates staler than this (default: none dropped)",
        min=0,
    ),
)


def staleness_weight(config: Config, staleness: int) -> float:
    """The weight of an update ``staleness`` server updates old (``async.staleness``)."""
    if config["async.staleness"] == "constant":
        return 1.0
    return float((1.0 + staleness) ** -config["async.exponent"])


class Channel(Protocol):
    """Sends fit messages without waiting and hands their replies back one at a time, in
    the order they arrive."""

    def dispatch(self, messages: dict[str, Message]) -> None: ...

    def next(self) -> tuple[str, Message]: ...

    def peek(self) -> float:
        """When the next reply arrives (``inf`` when none is expected; real time: ``0``)."""

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


class VirtualChannel:
    """Replies in simulated time: a message is delivered at once (its reply computed on the
    model it carries) and its reply kept until the clock reaches its arrival."""

    def __init__(self, exchange: Exchange, transport: Transport, clock: Clock):
        self.exchange, self.transport, self.clock = exchange, transport, clock
        self.heap: list[tuple[float, int, str]] = []
        self.replies: dict[str, Message] = {}
        self.order = 0

    def dispatch(self, messages: dict[str, Message]) -> None:
        replies = self.transport.send(messages)
        sizes = self.exchange.count(messages, replies)
        clock = self.clock
        for cid, message in messages.items():
            reply = replies[cid]
            down, up = sizes[cid]
            work = clock.work(cid, down, up, clock.samples(message, reply))
            heapq.heappush(self.heap, (clock.finish(cid, clock.now, work), self.order, cid))
            self.replies[cid] = reply
            self.order += 1

    def peek(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def next(self) -> tuple[str, Message]:
        t, _, cid = heapq.heappop(self.heap)
        self.clock.now = max(self.clock.now, t)
        return cid, self.replies.pop(cid)

    def state(self) -> dict[str, Any]:
        return {
            "heap": [list(entry) for entry in self.heap],
            "order": self.order,
            "replies": {cid: _plain(m) for cid, m in self.replies.items()},
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.heap = [(float(t), int(n), str(c)) for t, n, c in state["heap"]]
        heapq.heapify(self.heap)
        self.order = int(state["order"])
        self.replies = {cid: _message(m) for cid, m in state["replies"].items()}


class RealtimeChannel:
    """Replies in real time, through a transport that can push messages and pull the
    replies that have come (``push``/``pull``: the Flower engine's, over Flower's Grid)."""

    def __init__(self, exchange: Exchange, transport: Any):
        if not (hasattr(transport, "push") and hasattr(transport, "pull")):
            raise FedkitError(
                f"asynchronous aggregation in real time needs a transport that pushes and "
                f"pulls messages; {type(transport).__name__} cannot"
            )
        self.exchange, self.transport = exchange, transport
        self.arrived: list[tuple[str, Message]] = []

    def dispatch(self, messages: dict[str, Message]) -> None:
        self.exchange.count(messages, {})
        self.transport.push(messages)

    def peek(self) -> float:
        return 0.0

    def next(self) -> tuple[str, Message]:
        while not self.arrived:
            self.arrived = self.transport.pull()
        cid, reply = self.arrived.pop(0)
        self.exchange.count({}, {cid: reply})
        return cid, reply

    def state(self) -> dict[str, Any]:
        return {}  # a deployment is not resumed (see docs/engines.md)

    def restore(self, state: Mapping[str, Any]) -> None: ...


class Asynchronous(RoundMode):
    """Rounds of client updates applied as they arrive (FedBuff, FedAsync): a round is
    ``cohort`` updates (the clients a synchronous round samples)."""

    simulated = True
    #: whether the global state each client in flight trains on is kept (FedBuff's
    #: changes are taken from it)
    keeps_bases = False
    #: the factor of an update's staleness weight
    mixing = 1.0

    def __init__(self, config: Config, client_ids: Sequence[str], cohort: int):
        super().__init__(config, client_ids, cohort)
        self.mode = config["aggregation"]
        self.position = {cid: k for k, cid in enumerate(self.ids)}
        self.concurrency = min(len(self.ids), config["async.concurrency"] or cohort)
        self.buffer_size = config["async.buffer"] or self.concurrency
        #: server updates so far (the global model's version)
        self.version = 0
        #: clients in flight -> the version they train on
        self.flights: dict[str, int] = {}
        #: FedBuff: the global state of each version a client in flight trains on
        self.bases: dict[int, Arrays] = {}
        #: FedBuff: updates waiting for the next server update, each holding its weighted
        #: change of the model
        self.buffer: list[Update] = []
        self.dispatched = 0
        #: the round each client was last sent a model in (its first fit of a round is
        #: seeded as a synchronous round's, so a round without staleness is FedAvg's)
        self.sent_in: dict[str, int] = {}
        self.channel: Channel | None = None
        self._saved_channel: Mapping[str, Any] | None = None

    # ------------------------------------------------------------------ a round

    def train(self, server: Federation, transport: Transport, rnd: int) -> dict[str, Any]:
        """Run round ``rnd``'s client updates into the global model; the round's record."""
        server.observer.on_phase(rnd, "train", 0, self.cohort)
        channel = self._channel(server.exchange, transport)
        clock = server.exchange.clock
        applied: list[dict[str, Any]] = []
        train: dict[str, dict[str, Any]] = {}
        failed_in_a_row = 0
        updates_before = self.version
        while len(applied) < self.cohort:
            # replies that arrive at the same simulated moment are all applied before any
            # client is sent a model: else the first to reply would retrain the model of
            # before the buffer that its own reply completes (stale by one, for nothing)
            due = clock is not None and channel.peek() <= clock.now
            wake = math.inf if due else self._fill(server, channel, rnd)
            if clock is not None and wake < channel.peek():
                clock.now = wake  # an idle site comes back before the next reply
                continue
            cid, reply = channel.next()
            version = self.flights.pop(cid)
            if reply.error is not None:
                failed_in_a_row += 1
                self._failed(server, rnd, cid, reply, failed_in_a_row)
                continue
            failed_in_a_row = 0
            staleness = self.version - version
            limit = self.config["async.max_staleness"]
            if limit is not None and staleness > limit:
                server.exchange.events.append(
                    {
                        "round": rnd,
                        "phase": "fit",
                        "client": cid,
                        "error": f"update dropped: {staleness} server updates stale "
                        f"(async.max_staleness={limit})",
                    }
                )
                continue
            weight = staleness_weight(self.config, staleness)
            weight *= self.mixing
            entry = {"client": cid, "version": version, "staleness": staleness}
            entry["weight"] = round(weight, 6)
            if clock is not None:
                entry["arrived"] = round(clock.now, 3)
            applied.append(entry)
            train[cid] = {k: v for k, v in reply.scalars.items() if k != "num_examples"}
            update = Update(cid, reply.arrays, reply.scalars)
            self._apply(server, update, version, weight)
            self._prune()
        return {
            "round": rnd,
            "sampled": [c for c in self.ids if c in train],
            "train": {c: train[c] for c in self.ids if c in train},
            "global": {},
            "clients": {},
            "updates": applied,
            "server_updates": self.version - updates_before,
        }

    def _channel(self, exchange: Exchange, transport: Transport) -> Channel:
        if self.channel is None:
            if exchange.clock is not None:
                self.channel = VirtualChannel(exchange, transport, exchange.clock)
            else:
                self.channel = RealtimeChannel(exchange, transport)
            if self._saved_channel is not None:
                self.channel.restore(self._saved_channel)
        return self.channel

    def _fill(self, server: Federation, channel: Channel, rnd: int) -> float:
        """Send the current model to idle clients until ``concurrency`` train (in simulated
        time only to sites that are up: the server knows which are connected); returns
        when the first idle site that is down comes back (``inf``: none)."""
        free = self.concurrency - len(self.flights)
        if free <= 0:
            return math.inf
        clock = server.exchange.clock
        chosen: list[str] = []
        for cid in self._idle_in_random_order(free):  # the first `free` that are up
            if clock is None or clock.is_up(cid, clock.now):
                chosen.append(cid)
                if len(chosen) == free:
                    break
        wake = math.inf
        if len(chosen) < free and clock is not None:
            taken = set(chosen)
            idle = [c for c in self.ids if c not in self.flights and c not in taken]
            wake = min((clock.next_up(c, clock.now) for c in idle), default=wake)
            if not chosen and not self.flights:  # nothing to wait for but a site coming back
                if math.isinf(wake):
                    raise FedkitError("every idle site is down for good: the run cannot go on")
                clock.now = wake
                return self._fill(server, channel, rnd)
        if not chosen:
            return wake
        messages = {}
        for cid in sorted(chosen, key=self.position.__getitem__):  # sent in client order
            message = server.fit_message(cid, rnd)
            if self.sent_in.get(cid) == rnd:  # a second fit in one round: seeded apart
                message.scalars[TRIP] = self.dispatched
            self.sent_in[cid] = rnd
            self.dispatched += 1
            messages[cid] = message
            self.flights[cid] = self.version
        if self.keeps_bases and self.version not in self.bases:
            self.bases[self.version] = dict(server.ctx.global_state)
        channel.dispatch(messages)
        return wake

    def _idle_in_random_order(self, wanted: int) -> Iterator[str]:
        """The idle clients in a random order, deterministic per seed and dispatch. In a
        large federation with few clients in flight, drawn one by one (``wanted`` of them
        cost about as many draws, not a pass over every client); else shuffled whole."""
        idle_count = len(self.ids) - len(self.flights)
        rng = np.random.default_rng(derive_seed(self.config["seed"], "async", self.dispatched))
        if idle_count <= wanted:
            yield from (c for c in self.ids if c not in self.flights)
            return
        if idle_count > 2 * len(self.flights) and len(self.ids) > 1000:
            seen: set[str] = set()
            for _ in range(8 * wanted):  # then, if the sites drawn were down, all of them
                cid = self.ids[int(rng.integers(len(self.ids)))]
                if cid not in self.flights and cid not in seen:
                    seen.add(cid)
                    yield cid
            rest = [c for c in self.ids if c not in self.flights and c not in seen]
            yield from (rest[k] for k in rng.permutation(len(rest)))
            return
        idle = [c for c in self.ids if c not in self.flights]
        yield from (idle[k] for k in rng.permutation(len(idle)))

    def _failed(
        self, server: Federation, rnd: int, cid: str, reply: Message, in_a_row: int
    ) -> None:
        server.exchange.events.append(
            {"round": rnd, "phase": "fit", "client": cid, "error": reply.error}
        )
        if server.config["min_clients"] is None or in_a_row >= len(self.ids):
            if isinstance(reply.exception, FedkitError):
                raise reply.exception
            raise ClientFailure(cid, rnd, reply.error, bug=reply.bug) from reply.exception

    def _apply(self, server: Federation, update: Update, version: int, weight: float) -> None:
        """Take in one ``update`` trained on ``version``, of staleness weight ``weight``."""
        raise NotImplementedError

    def _prune(self) -> None:
        """Forget the global states no client in flight trains on any more."""
        wanted = set(self.flights.values())
        for version in [v for v in self.bases if v not in wanted]:
            del self.bases[version]

    # ------------------------------------------------------------------ persistence

    def state(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "flights": dict(self.flights),
            "bases": {str(v): s for v, s in self.bases.items()},
            "buffer": [
                {"client": u.client_id, "arrays": u.arrays, "scalars": u.scalars}
                for u in self.buffer
            ],
            "dispatched": self.dispatched,
            "sent_in": dict(self.sent_in),
            "channel": self.channel.state() if self.channel is not None else self._saved_channel,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.version = int(state["version"])
        self.flights = {str(c): int(v) for c, v in state["flights"].items()}
        self.bases = {int(v): dict(s) for v, s in state["bases"].items()}
        self.buffer = [Update(u["client"], u["arrays"], u["scalars"]) for u in state["buffer"]]
        self.dispatched = int(state["dispatched"])
        self.sent_in = {str(c): int(r) for c, r in state.get("sent_in", {}).items()}
        self._saved_channel = state["channel"]
        if self.channel is not None and state["channel"] is not None:
            self.channel.restore(state["channel"])


class FedBuff(Asynchronous):
    """``aggregation=fedbuff``: staleness-weighted changes buffered, applied every
    ``async.buffer`` updates (at ``async.server_lr``)."""

    keeps_bases = True

    def _apply(self, server: Federation, update: Update, version: int, weight: float) -> None:
        base = self.bases[version]
        change = {k: _difference(v, base[k]) * weight for k, v in update.arrays.items()}
        self.buffer.append(Update(update.client_id, change, update.scalars))
        if len(self.buffer) >= self.buffer_size:
            current = server.ctx.global_state
            rebased = [
                Update(u.client_id, _shifted(current, u.arrays, 1.0), u.scalars)
                for u in self.buffer
            ]
            new = server.strategy.aggregate(rebased, _no_queries(self.mode))
            lr = self.config["async.server_lr"]
            if lr != 1.0:
                change = {k: new[k].double() - current[k].double() for k in current}
                new = _shifted(current, change, lr)
            server.ctx.global_state = new
            self.buffer = []
            self.version += 1


class FedAsync(Asynchronous):
    """``aggregation=fedasync``: every update mixed in as it arrives, at ``async.alpha``
    times its staleness weight."""

    def __init__(self, config: Config, client_ids: Sequence[str], cohort: int):
        super().__init__(config, client_ids, cohort)
        self.mixing = config["async.alpha"]

    def _apply(self, server: Federation, update: Update, version: int, weight: float) -> None:
        current = server.ctx.global_state
        change = {k: _difference(v, current[k]) for k, v in update.arrays.items()}
        mixed = Update(update.client_id, _shifted(current, change, weight), update.scalars)
        server.ctx.global_state = server.strategy.aggregate([mixed], _no_queries(self.mode))
        self.version += 1


def _difference(value: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``value - base`` in the entry's floating dtype (integers: in float64)."""
    if base.dtype.is_floating_point:
        return value.to(base.dtype) - base
    return value.double() - base.double()


def _shifted(current: Arrays, change: Mapping[str, torch.Tensor], scale: float) -> Arrays:
    """``current + scale * change`` per entry, in each entry's dtype (integers rounded)."""
    out = {}
    for key, value in current.items():
        moved = value.double() + scale * change[key]
        out[key] = (moved if value.dtype.is_floating_point else moved.round()).to(value.dtype)
    return out


def _no_queries(mode: str):
    def ask(*args: Any, **kwargs: Any) -> dict:
        raise FedkitError(
            f"aggregation={mode}: a plugin's aggregation asked the clients an extra "
            "question, which needs a synchronous round (aggregation=sync or deadline)"
        )

    return ask


def _plain(message: Message) -> dict[str, Any]:
    """A message as plain values and tensors (checkpoints hold nothing else)."""
    return {
        "kind": message.kind,
        "arrays": dict(message.arrays),
        "scalars": dict(message.scalars),
        "error": message.error,
    }


def _message(plain: Mapping[str, Any]) -> Message:
    return Message(plain["kind"], dict(plain["arrays"]), dict(plain["scalars"]), plain["error"])
