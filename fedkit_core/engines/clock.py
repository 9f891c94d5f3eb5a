"""The virtual clock of a simulated federation: time advanced by compute and transfer.

Nothing waits for real. A message to client k that leaves the server at simulated time
``t`` starts when the site is free (``busy_until[k]``: still working on an earlier message)
and up, and takes::

    latency + bytes down / download  +  local_epochs * num_examples / samples_per_second
    + latency + bytes up / upload

(compute only for ``fit``; bytes as :func:`fedkit_core.contract.messages.message_bytes` counts
them). A site's work advances only while it is up: an outage met on the way pauses it
until the site is back (a message to a site that is down waits for it, as Flower's
SuperLink keeps a message until its node pulls it). Outages come from the profile's
fixed ``down`` intervals and its random failures, drawn per run seed and client, so a run
is deterministic per seed. See ``docs/hospitals.md``.

:meth:`Clock.exchange` is the synchronous round (``aggregation=sync`` / ``deadline``): it
ends when the last reply arrives, or at the deadline, replies past it failing the round
for that client. The asynchronous modes (:mod:`fedkit_core.engines.asynchronous`) ask
:meth:`Clock.finish` for each message's arrival and order them by it. ``evaluate`` messages
are a measurement, not the federation's work: they take no simulated time. ``setup``
keeps each site busy until it is set up, without the server waiting for it (a site that
joins late is set up when it joins).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fedkit_core.config import Config
from fedkit_core.contract.messages import Message
from fedkit_core.hooks.context import derive_seed
from fedkit_core.sites import Availability, SiteProfile, parse_sites

#: the kinds of message whose round trip the clock counts
TIMED = ("setup", "fit", "query")


def default_profile() -> SiteProfile:
    """Every site when a run gives no ``sites``: the base speed on a hospital LAN (a
    profile of :data:`fedkit_core.sites.DEFAULTS`)."""
    return parse_sites({"profiles": {"default": {}}}).profiles["default"]


def clock_for(config: Config, client_ids: Sequence[str], simulated: bool) -> Clock | None:
    """The run's virtual clock: with ``sites`` (their profiles) or a round mode that keeps
    ``simulated`` time (every site the :func:`default_profile`); else none, and the run's
    records are those of a run without one. A round waits ``deadline`` seconds at most
    where that is set (only with ``aggregation=deadline``)."""
    spec = config["sites"]
    if spec is None and not simulated:
        return None
    if spec is None:
        profiles = dict.fromkeys(client_ids, default_profile())
    else:
        profiles = parse_sites(spec).assign(client_ids, config["seed"])
    return Clock(profiles, config["seed"], config["local_epochs"], config["deadline"])


class Downtime:
    """One site's outages, sorted by start: the fixed ones and random failures generated
    as far as they are asked for (the same sequence whatever is asked first)."""

    def __init__(self, availability: Availability, seed: int):
        self.fixed = list(availability.down)
        self.rate = availability.failure_rate
        self.repair = availability.repair
        self.rng = np.random.default_rng(seed) if self.rate > 0 else None
        self.random: list[tuple[float, float]] = []
        self.starts: list[float] = []

    def after(self, t: float) -> Iterator[tuple[float, float]]:
        """Outages ending after ``t``, by start (they may overlap: the clock skips what
        it has passed)."""
        fixed = (o for o in self.fixed if o[1] > t)
        if self.rng is None:
            return fixed
        return heapq.merge(fixed, self._random_from(t))

    def _random_from(self, t: float) -> Iterator[tuple[float, float]]:
        # a random outage ending after t starts at most `repair` before t
        k = max(0, bisect.bisect_left(self.starts, t - self.repair) - 1)
        while True:
            while k >= len(self.random):
                self._draw()
            outage = self.random[k]
            if outage[1] > t:
                yield outage
            k += 1

    def _draw(self) -> None:
        begin = self.random[-1][1] if self.random else 0.0
        start = begin + float(self.rng.exponential(1.0 / self.rate))
        self.random.append((start, start + self.repair))
        self.starts.append(start)


class Clock:
    """Simulated time of a federation: ``now`` (the server's), each site's ``busy_until``,
    and the outages that delayed work in the current round (:attr:`outages`)."""

    def __init__(
        self,
        profiles: Mapping[str, SiteProfile],
        seed: int,
        local_epochs: int,
        deadline: float | None = None,
    ):
        self.profiles = dict(profiles)
        self.local_epochs = local_epochs
        self.deadline = deadline
        self.now = 0.0
        self.busy_until: dict[str, float] = {}
        #: ``{"client", "from", "to", "waited"}`` of each outage that paused a site's work,
        #: since the round began (see :meth:`take_outages`)
        self.outages: list[dict[str, Any]] = []
        self.seed = seed
        #: each site's outages, made when first asked for (a federation may be large)
        self._downtimes: dict[str, Downtime | None] = {}

    def _downtime(self, cid: str) -> Downtime | None:
        """Site ``cid``'s outages (``None``: always up)."""
        if cid not in self._downtimes:
            availability = self.profiles[cid].availability
            self._downtimes[cid] = (
                None
                if availability.always_up
                else Downtime(availability, derive_seed(self.seed, "availability", cid))
            )
        return self._downtimes[cid]

    # ------------------------------------------------------------------ durations

    def work(self, cid: str, down: int, up: int, samples: int) -> float:
        """Seconds of up-time one message takes: transfers both ways and ``samples`` of
        training."""
        p = self.profiles[cid]
        return 2 * p.latency + down / p.download + up / p.upload + samples / p.samples_per_second

    def samples(self, message: Message, reply: Message | None) -> int:
        """The training samples a message makes its client process (``fit``: every local
        epoch over the examples it reports; nothing for other kinds or a failed reply)."""
        if message.kind != "fit" or reply is None or reply.error is not None:
            return 0
        return self.local_epochs * int(reply.scalars.get("num_examples", 0))

    def finish(self, cid: str, start: float, seconds: float) -> float:
        """When ``seconds`` of up-time of site ``cid`` beginning at ``start`` end, outages
        pausing it (each one met is noted in :attr:`outages`); the site is busy until then."""
        begin = max(start, self.busy_until.get(cid, 0.0))
        t, left = begin, seconds
        downtime = self._downtime(cid)
        if downtime is not None:
            for a, b in downtime.after(t):
                if a > t:
                    if t + left <= a:
                        break
                    left -= a - t
                if b > t:
                    self.outages.append(
                        {"client": cid, "from": a, "to": b, "waited": b - max(a, t)}
                    )
                    t = b
        end = t + left
        self.busy_until[cid] = end
        return end

    def is_up(self, cid: str, t: float) -> bool:
        """Whether site ``cid`` is up at ``t``."""
        downtime = self._downtime(cid)
        for a, _ in downtime.after(t) if downtime is not None else ():
            return a > t  # the earliest outage not over by t
        return True

    def next_up(self, cid: str, t: float) -> float:
        """The first moment from ``t`` on when site ``cid`` is up."""
        downtime = self._downtime(cid)
        if downtime is None:
            return t
        for a, b in downtime.after(t):
            if a > t:
                return t
            t = max(t, b)
        return t

    # ------------------------------------------------------------------ synchronous rounds

    def admit(
        self, messages: Mapping[str, Message]
    ) -> tuple[dict[str, Message], dict[str, Message]]:
        """Of a synchronous exchange's ``messages`` (beginning at :attr:`now`), those to
        send, and failed replies for the fit messages a site could not even start before
        the deadline (busy, or down, until then): such a message expires unread, as a
        Flower message past its TTL, and the site neither trains on it nor is busy with it.
        Without a deadline every message is sent."""
        if self.deadline is None:
            return dict(messages), {}
        cutoff = self.now + self.deadline
        send, expired = {}, {}
        for cid, message in messages.items():
            begin = self.now
            if message.kind == "fit":
                begin = self.next_up(cid, max(self.now, self.busy_until.get(cid, 0.0)))
            if begin < cutoff:
                send[cid] = message
                continue
            expired[cid] = Message(
                "fit",
                error=(
                    f"missed the deadline: the site was busy or down until "
                    f"{begin - self.now:.1f} s after the round began (deadline "
                    f"{self.deadline:g} s of simulated time); the message expired unread"
                ),
            )
        return send, expired

    def exchange(
        self,
        messages: Mapping[str, Message],
        replies: dict[str, Message],
        sizes: Mapping[str, tuple[int, int]],
        expired: bool = False,
    ) -> dict[str, Message]:
        """A synchronous exchange that began at :attr:`now`: every timed message's arrival,
        ``now`` moved to the last one. With a deadline, fit replies arriving after it are
        failed (the server stopped waiting then; the site finishes its work and is busy
        until it has), and ``expired`` says messages of the exchange were not sent
        (:meth:`admit`): the server waited until the deadline for them too. ``sizes``:
        bytes down and up per client."""
        timed = [cid for cid, m in messages.items() if m.kind in TIMED]
        if not timed:
            if expired:
                self.now += self.deadline
            return replies
        start = self.now
        arrivals = {}
        for cid in timed:
            message, reply = messages[cid], replies.get(cid)
            down, up = sizes.get(cid, (0, 0))
            work = self.work(cid, down, up, self.samples(message, reply))
            arrivals[cid] = self.finish(cid, start, work)
        end = max(arrivals.values())
        if all(messages[cid].kind == "setup" for cid in timed):
            return replies  # a site is busy until set up; the server waits for its first update
        if self.deadline is not None:
            cutoff = start + self.deadline
            late = [cid for cid in timed if messages[cid].kind == "fit" and arrivals[cid] > cutoff]
            for cid in late:
                replies[cid] = Message(
                    "fit",
                    error=(
                        f"missed the deadline: its update would arrive "
                        f"{arrivals[cid] - start:.1f} s after the round began "
                        f"(deadline {self.deadline:g} s of simulated time)"
                    ),
                )
            if late or expired:  # the server waited until the deadline
                end = cutoff
        self.now = end
        return replies

    def take_outages(self) -> list[dict[str, Any]]:
        """The outages noted since the last call, each once, by start: ``client``, ``from``,
        ``to`` (simulated seconds) and ``waited``, the seconds of work it held up."""
        merged: dict[tuple[str, float, float], float] = {}
        for o in self.outages:
            key = (o["client"], o["from"], o["to"])
            merged[key] = merged.get(key, 0.0) + o["waited"]
        self.outages = []
        return [
            {"client": c, "from": round(a, 3), "to": round(b, 3), "waited": round(w, 3)}
            for (c, a, b), w in sorted(merged.items(), key=lambda item: (item[0][1], item[0][0]))
        ]

    # ------------------------------------------------------------------ persistence

    def state(self) -> dict[str, Any]:
        return {"now": self.now, "busy_until": dict(self.busy_until)}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.now = float(state["now"])
        self.busy_until = {k: float(v) for k, v in state["busy_until"].items()}
        self.outages = []
