"""How rounds proceed: the round modes, chosen by the ``aggregation`` key.

A round mode trains one round: it asks the :class:`Federation` (the server's loop) for the
clients, the fit messages, the exchange and the strategy, and returns the round's record
(``round``, ``global``, ``clients`` and what it trained); the loop then adds the round's
traffic, time and evaluation. Built in: ``sync`` and ``deadline`` (here) and ``fedbuff``
and ``fedasync`` (:mod:`fedkit_core.engines.asynchronous`). A plugin adds a mode with the
hook ``fedkit_register_round_modes(register)``: a subclass of :class:`RoundMode` in one
file (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from fedkit_core.config import Config
from fedkit_core.contract.messages import Message, Reply
from fedkit_core.contract.observer import Observer
from fedkit_core.contract.options import Option
from fedkit_core.engines.exchange import Exchange, Transport
from fedkit_core.hooks.context import ServerContext

ROUND_OPTIONS = (
    Option(
        "aggregation",
        str,
        "sync",
        "how rounds proceed: sync: every sampled client each round; deadline: as sync, but "
        "updates arriving after `deadline` seconds of simulated time are dropped; fedbuff: "
        "buffered asynchronous (FedBuff, staleness-weighted); fedasync: every update mixed in "
        "as it arrives (FedAsync); or a round mode a plugin registers "
        "(fedkit_register_round_modes). A round is as many client updates as sync samples",
    ),
    Option(
        "deadline",
        float,
        None,
        "aggregation=deadline: seconds a round waits for updates (simulated; real seconds "
        "when deployed)",
        gt=0,
    ),
)


class Federation(Protocol):
    """What a round mode may ask of the server's loop."""

    config: Config
    ctx: ServerContext
    observer: Observer
    exchange: Exchange
    #: the strategy (:class:`~fedkit_core.engines.strategy.Strategy`, maybe wrapped by privacy)
    strategy: Any

    @property
    def client_ids(self) -> list[str]: ...

    def fit_messages(self, sampled: Sequence[str], rnd: int) -> dict[str, Message]:
        """Round ``rnd``'s fit messages to the ``sampled`` clients."""

    def fit_message(self, cid: str, rnd: int) -> Message:
        """The fit message of client ``cid``: the global state, the round's settings and
        what plugins send it."""

    def fit(
        self, transport: Transport, messages: dict[str, Message], rnd: int
    ) -> dict[str, Message]:
        """The fit exchange (carrying a waiting evaluation of the previous round)."""

    def asker(
        self, transport: Transport, rnd: int, default: list[str]
    ) -> Callable[..., dict[str, Reply]]:
        """The ``ask`` an aggregator gets: a query to ``default`` clients (or those named)."""


class RoundMode:
    """A way rounds proceed. Made once per run (``config``, every client id and the
    clients a synchronous round samples, ``cohort``); :meth:`train` runs one round."""

    #: whether the run keeps simulated time even without ``sites`` (the modes whose
    #: updates arrive at different times)
    simulated: ClassVar[bool] = False
    #: whether a round's evaluation may travel with the next round's fit messages
    pipelines_evaluation: ClassVar[bool] = False
    #: the fewest updates a round needs when ``min_clients`` is unset (None: every one sent)
    least: ClassVar[int | None] = None
    #: whether it runs with secure aggregation (SecAgg+ sums one synchronous round)
    secure: ClassVar[bool] = False

    def __init__(self, config: Config, client_ids: Sequence[str], cohort: int):
        self.config = config
        self.ids = list(client_ids)
        self.cohort = cohort

    @classmethod
    def check(cls, config: Config, plugins: Any) -> None:
        """Refuse a run this mode cannot serve, saying why (before any data is loaded)."""

    def train(self, federation: Federation, transport: Transport, rnd: int) -> dict[str, Any]:
        """Train round ``rnd`` into the global model (``federation.ctx.global_state``);
        the round's record."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """What the mode holds between rounds (checkpointed with the server)."""
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take up :meth:`state` of an interrupted run."""


class Synchronous(RoundMode):
    """``aggregation=sync``: every client the strategy selects trains on the global model,
    the server waits for every reply, then aggregates."""

    pipelines_evaluation = True
    secure = True

    def train(self, federation: Federation, transport: Transport, rnd: int) -> dict[str, Any]:
        strategy, exchange = federation.strategy, federation.exchange
        sampled = strategy.select(federation.client_ids, rnd)
        federation.observer.on_phase(rnd, "train", 0, len(sampled))
        messages = federation.fit_messages(sampled, rnd)
        replies = federation.fit(transport, messages, rnd)
        ok = exchange.failures("fit", rnd, replies, required=exchange.required(len(messages)))
        updates = strategy.updates(replies, ok, rnd)
        ask = federation.asker(transport, rnd, ok)
        federation.ctx.global_state = strategy.aggregate(updates, ask, rnd)
        record: dict[str, Any] = {"round": rnd, "global": {}, "clients": {}}
        record.update(strategy.train_record(sampled, ok, replies))
        return record


class Deadline(Synchronous):
    """``aggregation=deadline``: a synchronous round whose updates arriving after
    ``deadline`` seconds are dropped (the clock fails them); one update at least."""

    simulated = True
    pipelines_evaluation = False
    least = 1
    secure = False
