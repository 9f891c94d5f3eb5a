"""How the server's messages reach the clients: bytes counted, simulated time, failures.

Every part of a round that talks to clients (the round modes, the evaluation, an
aggregator's queries) sends through one :class:`Exchange`, so the traffic of a round, its
simulated time (:mod:`fedkit_core.engines.clock`) and its failed clients are kept in one
place, whatever sent the messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fedkit_core.config import Config
from fedkit_core.contract.messages import Message, message_bytes
from fedkit_core.engines.clock import Clock
from fedkit_core.errors import ClientFailure, FedkitError, NoSpace
from fedkit_core.privacy.layer import HIDDEN_CLIENT


class Transport(Protocol):
    """Delivers one message per client id and returns the replies (``error`` set on failure)."""

    def send(self, messages: dict[str, Message]) -> dict[str, Message]: ...


class Exchange:
    """Delivers the server's messages over a transport and keeps what that costs: the
    bytes each client sent and received in the current phase (:attr:`traffic`), the
    simulated time (:attr:`clock`, None when time is real) and the failed replies
    (:attr:`events`). ``hidden``: no fit failure may name its client (secret DP sampling);
    ``least``: the fewest updates a round needs when ``min_clients`` is unset (None: all)."""

    def __init__(self, config: Config, clock: Clock | None, hidden: bool, least: int | None):
        self.config = config
        self.clock = clock
        self.hidden = hidden
        self.least = least
        #: ``{"round", "phase", "client", "error"}`` of every failed reply
        self.events: list[dict[str, Any]] = []
        #: bytes sent to ("down") and received from ("up") each client in the current phase
        self.traffic: dict[str, dict[str, int]] = {}
        self.setup_traffic: dict[str, dict[str, int]] = {}

    def send(self, transport: Transport, messages: dict[str, Message]) -> dict[str, Message]:
        """Deliver ``messages``, count the bytes each client sent and received and, with a
        virtual clock, the simulated time the exchange took (see engines/clock.py; with a
        deadline, a fit message its site cannot start before it is not sent)."""
        if not messages:  # a Poisson sample may be empty
            return {}
        if self.clock is None:
            replies = transport.send(messages)
            self.count(messages, replies)
            return replies
        sent, expired = self.clock.admit(messages)
        replies = transport.send(sent) if sent else {}
        replies = self.clock.exchange(sent, replies, self.count(sent, replies), bool(expired))
        return {cid: replies[cid] if cid in replies else expired[cid] for cid in messages}

    def count(
        self, messages: Mapping[str, Message], replies: Mapping[str, Message]
    ) -> dict[str, tuple[int, int]]:
        """Count the bytes of ``messages`` (down) and ``replies`` (up) in :attr:`traffic`;
        ``{client id: (down, up)}`` of these."""
        sizes = {}
        for cid in dict.fromkeys([*messages, *replies]):
            down = message_bytes(messages[cid]) if cid in messages else 0
            up = message_bytes(replies[cid]) if cid in replies else 0
            counts = self.traffic.setdefault(cid, {"down": 0, "up": 0})
            counts["down"] += down
            counts["up"] += up
            sizes[cid] = (down, up)
        return sizes

    def required(self, sent: int) -> int:
        """How many of ``sent`` messages must succeed (``min_clients``, else all, or
        :attr:`least` where the round mode drops late updates)."""
        wanted = self.config["min_clients"]
        if wanted is None:
            wanted = self.least
        return sent if wanted is None else min(wanted, sent)

    def failures(
        self, phase: str, rnd: int, replies: dict[str, Message], required: int
    ) -> list[str]:
        """The clients whose reply succeeded; the failed ones are recorded in
        :attr:`events`, and fewer than ``required`` successes (or none) end the run with
        the first failure's error."""
        ok = [cid for cid, msg in replies.items() if msg.error is None]
        failed = {cid: msg for cid, msg in replies.items() if msg.error is not None}
        for cid, msg in failed.items():
            who = HIDDEN_CLIENT if self.hidden and phase not in ("setup", "evaluate") else cid
            self.events.append({"round": rnd, "phase": phase, "client": who, "error": msg.error})
            if isinstance(msg.exception, NoSpace):  # the machine's: every client would fail
                raise msg.exception
        if len(ok) < required or (failed and not ok):  # none left, even with min_clients=0
            cid, msg = next(iter(failed.items()))
            if isinstance(msg.exception, FedkitError):
                raise msg.exception
            raise ClientFailure(cid, rnd, msg.error, bug=msg.bug) from msg.exception
        return ok
