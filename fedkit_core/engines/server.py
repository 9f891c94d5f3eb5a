"""The server side of the protocol: a short loop over a round's parts, and the records.

The server talks to clients only through a :class:`Transport` (``send`` a message per
client id, get a reply per client id). The in-process engine delivers messages by direct
calls; the Flower engine wraps them in Flower messages. Everything else is shared.

Each round the loop asks its parts, each with one job: the round mode (how rounds
proceed, :mod:`.rounds`, :mod:`.asynchronous`), the strategy (who trains and how updates
are combined and checked, :mod:`.strategy` with :mod:`.selection`; privacy wraps it,
:mod:`fedkit_core.privacy.rounds`), the exchange (bytes, simulated time and failures,
:mod:`.exchange`) and the evaluation (:mod:`.evaluation`, :mod:`.scoring`). The server holds
the run's records and the global model's context.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, TaskInfo
from fedkit_core.contract.messages import (
    Arrays,
    Message,
    Payload,
    Reply,
    check_arrays,
    check_scalars,
)
from fedkit_core.contract.observer import Observer
from fedkit_core.contract.protocol import CLASS_COUNTS, PAYLOAD
from fedkit_core.engines.clock import clock_for
from fedkit_core.engines.evaluation import Evaluation
from fedkit_core.engines.exchange import Exchange, Transport
from fedkit_core.engines.model import build_model
from fedkit_core.engines.modes import mode_class
from fedkit_core.engines.selection import cohort_size, selection_rule
from fedkit_core.engines.strategy import Strategy, asker
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ServerContext, derive_seed, lr_at
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.privacy.layer import hides_sampling
from fedkit_core.privacy.rounds import private


def shot_groups(counts: np.ndarray, thresholds: Sequence[int]) -> dict[str, list[int]]:
    """Head (> many), medium and tail (< few) classes of pooled training ``counts``."""
    if len(thresholds) != 2:
        raise FedkitError("task.shot_thresholds must be [many, few]")
    many, few = thresholds
    return {
        "head": [c for c, n in enumerate(counts) if n > many],
        "medium": [c for c, n in enumerate(counts) if few <= n <= many],
        "tail": [c for c, n in enumerate(counts) if n < few],
    }


class Server:
    """Runs the federation over a transport and keeps the per-round records."""

    def __init__(
        self,
        config: Config,
        plugins: PluginSet,
        task: TaskInfo,
        device: torch.device,
        observer: Observer | None = None,
        deployed: bool = False,
    ):
        self.config, self.plugins, self.task = config, plugins, task
        self.observer = observer or Observer()
        self.ctx = ServerContext(task, config, device)
        self.records: list[dict[str, Any]] = []
        #: who served each client, as the engine knows it (results.json's ``nodes``; None:
        #: the engine has no nodes to name, as the local one)
        self.nodes: dict[str, Any] | None = None
        #: accepted edits of the config on resume: from which round on the run used which
        #: config (``fedkit resume --accept-edits``)
        self.config_edits: list[dict[str, Any]] = []
        #: resumes from checkpoint files without digests (``--accept-unverified``)
        self.unverified: list[dict[str, Any]] = []
        self.next_round = 1
        self.seconds = 0.0
        #: how the model's batch-norm layers travel (``bn``: see
        #: :meth:`~fedkit_core.models.fedmodel.FedModel.batch_norm_policy`), set by :meth:`setup`
        self.normalisation: dict[str, Any] = {}
        ids = task.client_ids
        mode = mode_class(config, plugins)
        #: how rounds proceed (``aggregation``)
        self.mode = mode(config, ids, cohort_size(len(ids), config["sample_fraction"]))
        #: simulated time (``sites``, aggregation modes); none when deployed, where time is real
        clock = None if deployed else clock_for(config, ids, mode.simulated)
        self.exchange = Exchange(config, clock, hides_sampling(config), mode.least)
        rule = selection_rule(config["selection"], plugins)
        plain = Strategy(self.ctx, plugins.hook, rule, config["selection"])
        #: who trains and how updates are combined, wrapped in the run's privacy
        self.strategy = private(plain, config, plugins, self.ctx, clock is not None)
        self.evaluation = Evaluation(
            config,
            self.ctx,
            plugins.hook,
            self.exchange,
            self.records,
            lambda: self.strategy.last_round,
            deployed,
        )
        # a late or busy client must not hold up a score
        if not (mode.pipelines_evaluation and self.strategy.carries_evaluation):
            self.evaluation.with_fit = False
        self._on_round: Callable[[Server], None] | None = None

    @property
    def hook(self) -> Any:
        return self.plugins.hook

    @property
    def client_ids(self) -> list[str]:
        return list(self.task.client_ids)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every failed reply (``round``, ``phase``, ``client``, ``error``)."""
        return self.exchange.events

    @property
    def setup_traffic(self) -> dict[str, dict[str, int]]:
        return self.exchange.setup_traffic

    # ------------------------------------------------------------------ setup

    def setup(self, priors: Arrays | None = None) -> None:
        """Build server priors and the initial global state (plugins were checked when the
        run was resolved, see :func:`fedkit_core.resolve.check_plugins`)."""
        if priors is None:
            priors = {}
            for part in self.hook.fedkit_server_priors(server=self.ctx):
                priors.update(check_arrays(dict(part or {}), "fedkit_server_priors"))
        self.ctx.priors = priors
        torch.manual_seed(derive_seed(self.config["seed"], "model", "server"))
        model = build_model(self.plugins, self.ctx)
        self.ctx.global_state = model.shared_state()
        self.normalisation = {
            "bn": model.batch_norm_policy(),
            "batch_norm_layers": len(model.batch_norm_layers(extras=False)),
        }
        self.evaluation.setup(not self.plugins.active and not model.private_state())

    def setup_clients(self, transport: Transport, ids: Iterable[str]) -> None:
        """Send the server priors; with ``task.shot_thresholds`` set, the clients' training
        class counts come back (the only statistic the setup shares) for the shot groups."""
        ids = list(ids)
        exchange = self.exchange
        exchange.traffic = {}
        replies = exchange.send(transport, {cid: Message("setup", self.ctx.priors) for cid in ids})
        exchange.setup_traffic = exchange.traffic
        ok = exchange.failures("setup", 0, replies, required=len(ids))
        thresholds = self.config["task.shot_thresholds"]
        if thresholds and self.task.kind == CLASSIFICATION:
            counts = sum(replies[cid].arrays[CLASS_COUNTS].numpy() for cid in ok)
            self.task.shot_groups = shot_groups(np.asarray(counts), thresholds)

    # ------------------------------------------------------------------ rounds

    def run(self, transport: Transport, on_round: Callable[[Server], None] | None = None) -> None:
        """Run rounds ``next_round .. rounds``; ``on_round`` is called after each (checkpoints).
        A round whose evaluation travels with the next round's fit messages
        (``eval_with_fit``) is complete once those replies are in (see :meth:`fit`)."""
        self._on_round = on_round
        self.observer.on_start(self.config["rounds"], self.next_round)
        while self.next_round <= self.strategy.last_round:
            start = time.perf_counter()
            record = self.run_round(transport, self.next_round)
            record["seconds"] = round(time.perf_counter() - start, 3)
            self.seconds += record["seconds"]
            self.next_round += 1
            if record is not self.evaluation.pending:
                self._complete(record)

    def _complete(self, record: dict[str, Any]) -> None:
        """Keep a round's finished ``record``, checkpoint and report it."""
        self.records.append(record)
        if self._on_round is not None:
            self._on_round(self)
        self.observer.on_round_end(record)

    def run_round(self, transport: Transport, rnd: int) -> dict[str, Any]:
        """Train round ``rnd`` (its round mode), then add its traffic, simulated time and
        privacy entries and evaluate it: now, or with the next round's fit messages."""
        self.ctx.round = rnd
        self.exchange.traffic = {}
        record = self.mode.train(self, transport, rnd)
        cfg, strategy, clock = self.config, self.strategy, self.exchange.clock
        record["bytes"] = strategy.traffic(self.exchange.traffic)
        if clock is not None:
            record["simulated_seconds"] = round(clock.now, 3)
            outages = clock.take_outages()
            if outages:
                record["outages"] = outages
        record.update(strategy.round_record(rnd))
        if strategy.is_last(rnd) or (rnd % cfg["eval_every"] == 0 and not self.evaluation.with_fit):
            self.observer.on_phase(rnd, "evaluate", 0, len(self.client_ids))
            record.update(self.evaluation.evaluate(transport, rnd))
        elif rnd % cfg["eval_every"] == 0:
            self.evaluation.pending = record
        return record

    def fit(
        self, transport: Transport, messages: dict[str, Message], rnd: int
    ) -> dict[str, Message]:
        """The fit exchange of round ``rnd``; a previous round's pending evaluation travels
        with it, and that round is completed before this one aggregates."""
        pending, self.evaluation.pending = self.evaluation.pending, None
        if pending is None:
            return self.strategy.fit(self.exchange, transport, messages, rnd)
        replies = self.evaluation.with_fit_messages(transport, messages, pending)
        self._complete(pending)
        return replies

    def fit_messages(self, sampled: Sequence[str], rnd: int) -> dict[str, Message]:
        """Round ``rnd``'s fit messages: one to each sampled client (the pooled reference
        trains one central party instead, see :mod:`fedkit_core.engines.pooled`)."""
        return {cid: self.fit_message(cid, rnd) for cid in sampled}

    def fit_message(self, cid: str, rnd: int) -> Message:
        """The global state and round settings, plus what plugins send this client."""
        payload = Payload()
        for part in self.hook.fedkit_configure_fit(server=self.ctx, client_id=cid):
            if part is not None:
                payload.merge(part, "fedkit_configure_fit")
        arrays = check_arrays(payload.arrays, "fedkit_configure_fit")
        scalars = check_scalars(payload.scalars, "fedkit_configure_fit")
        return Message(
            "fit",
            {**self.ctx.global_state, **{PAYLOAD + k: v for k, v in arrays.items()}},
            {
                "round": rnd,
                "lr": lr_at(self.config, rnd),
                **self.strategy.fit_scalars(),
                **{PAYLOAD + k: v for k, v in scalars.items()},
            },
        )

    def asker(
        self, transport: Transport, rnd: int, default: list[str]
    ) -> Callable[..., dict[str, Reply]]:
        """The ``ask`` of ``fedkit_aggregate`` in round ``rnd`` (see :func:`asker`)."""
        return asker(self.strategy, self.exchange, self.observer, transport, rnd, default)

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, Any]:
        clock = self.exchange.clock
        return {
            "next_round": self.next_round,
            "global_state": self.ctx.global_state,
            "priors": self.ctx.priors,
            "server_state": self.ctx.states,
            "shot_groups": self.task.shot_groups,
            "records": self.records,
            "events": self.events,
            "seconds": self.seconds,
            "best_state": self.evaluation.best_state,
            "config_edits": self.config_edits,
            "unverified": self.unverified,
            "clock": clock.state() if clock is not None else None,
            "asynchronous": self.mode.state() or None,
        }

    def restore(self, snap: dict[str, Any]) -> None:
        self.next_round = snap["next_round"]
        self.ctx.global_state = snap["global_state"]
        self.ctx.states = snap["server_state"]
        self.task.shot_groups = snap["shot_groups"]
        self.records[:] = snap["records"]
        self.events[:] = snap["events"]
        self.seconds = snap["seconds"]
        self.evaluation.best_state = snap.get("best_state")
        self.strategy.restore()
        self.config_edits = snap.get("config_edits", [])
        self.unverified = snap.get("unverified", [])
        clock = self.exchange.clock
        if clock is not None and snap.get("clock") is not None:
            clock.restore(snap["clock"])
        if snap.get("asynchronous") is not None:
            self.mode.restore(snap["asynchronous"])
