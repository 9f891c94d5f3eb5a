"""The server side of the protocol: rounds, sampling, aggregation, evaluation, records.

The server talks to clients only through a :class:`Transport` (``send`` a message per
client id, get a reply per client id). The in-process engine delivers messages by direct
calls; the Flower engine wraps them in Flower messages. Everything else is shared.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.context import ServerContext, derive_seed, lr_at
from fedkit_core.contract.data import CLASSIFICATION, TaskInfo
from fedkit_core.contract.messages import (
    Arrays,
    Message,
    Payload,
    Reply,
    Update,
    check_arrays,
    check_scalars,
    enclose,
    message_bytes,
    take_out,
)
from fedkit_core.contract.observer import Observer
from fedkit_core.contract.protocol import CLASS_COUNTS, EVALUATION, PAYLOAD
from fedkit_core.engines.asynchronous import ASYNCHRONOUS, AsynchronousRounds
from fedkit_core.engines.clock import clock_for
from fedkit_core.engines.model import build_model
from fedkit_core.errors import ClientFailure, FedkitError, NoSpace
from fedkit_core.metrics.fairness import fairness
from fedkit_core.metrics.statistics import add_stats, predicted_classes
from fedkit_core.plugin_manager import BUILTINS, PluginSet
from fedkit_core.privacy.checks import declared_channels
from fedkit_core.privacy.layer import (
    ALL_CLIENTS,
    HIDDEN_CLIENT,
    ServerPrivacy,
    hides_sampling,
    private_scalars,
    privatised_channels,
)
from fedkit_core.results.schema import CSV_COLUMNS, best_round

log = logging.getLogger("fedkit")


class Transport(Protocol):
    """Delivers one message per client id and returns the replies (``error`` set on failure)."""

    def send(self, messages: dict[str, Message]) -> dict[str, Message]: ...


def cohort_size(clients: int, fraction: float) -> int:
    """How many of ``clients`` a round samples: ``max(1, round(fraction * clients))``."""
    return min(clients, max(1, int(round_half_up(fraction * clients))))


def sample_clients(ids: Sequence[str], fraction: float, seed: int, round: int) -> list[str]:
    """A deterministic sample of ``max(1, round(fraction * n))`` clients, in id order."""
    k = cohort_size(len(ids), fraction)
    if k == len(ids):
        return list(ids)
    rng = np.random.default_rng(derive_seed(seed, "sample", round))
    chosen = set(rng.choice(len(ids), size=k, replace=False).tolist())
    return [cid for i, cid in enumerate(ids) if i in chosen]


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


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
        self.config = config
        #: evaluation mode: ``evaluation=auto`` is federated when deployed, else pooled
        self.evaluation = config["evaluation"]
        if self.evaluation == "auto":
            self.evaluation = "federated" if deployed else "pooled"
        self.plugins = plugins
        self.task = task
        self.observer = observer or Observer()
        self.ctx = ServerContext(task, config, device)
        self.records: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        #: who served each client, as the engine knows it (results.json's ``nodes``; None:
        #: the engine has no nodes to name, as the local one)
        self.nodes: dict[str, Any] | None = None
        #: accepted edits of the config on resume: from which round on the run used which
        #: config (``fedkit resume --accept-edits``)
        self.config_edits: list[dict[str, Any]] = []
        #: resumes from checkpoint files without digests (``--accept-unverified``)
        self.unverified: list[dict[str, Any]] = []
        self._warned: set[tuple[str, ...]] = set()  # warnings given once per run
        self.next_round = 1
        self.seconds = 0.0
        #: bytes sent to ("down") and received from ("up") each client in the current phase
        self.traffic: dict[str, dict[str, int]] = {}
        self.setup_traffic: dict[str, dict[str, int]] = {}
        #: whether clients evaluate the global model alone (no plugins, nothing private)
        self.global_only = False
        #: ``eval_test=improved`` with :attr:`global_only`: the round best on validation so
        #: far and its global state, whose test split is scored in the last round if needed
        self.best_state: dict[str, Any] | None = None
        #: whether a round's evaluation may travel with the next round's fit messages
        #: (``eval_with_fit``; only with :attr:`global_only`, set up by :meth:`setup`)
        self.eval_with_fit = config["eval_with_fit"] == "true" or (
            config["eval_with_fit"] == "auto" and deployed
        )
        #: the record of the last round while its evaluation waits for the next round's
        #: messages (see :meth:`run`)
        self.pending: dict[str, Any] | None = None
        #: differential privacy and secure aggregation (see :mod:`fedkit_core.privacy`)
        self.privacy = ServerPrivacy(config, len(task.client_ids))
        if self.privacy.active:
            self.privacy.allowed = privatised_channels(declared_channels(plugins, self.ctx))
        self.private = self.privacy.active or bool(config["secagg.enabled"])
        self.hidden = hides_sampling(config)  # no record may name the sampled clients
        if config["secagg.enabled"]:  # an evaluation cannot travel inside SecAgg+'s stages
            self.eval_with_fit = False
        #: how the model's batch-norm layers travel (``bn``: see
        #: :meth:`~fedkit_core.models.fedmodel.FedModel.batch_norm_policy`), set by :meth:`setup`
        self.normalisation: dict[str, Any] = {}
        #: simulated time (``sites``, aggregation modes); none when deployed, where time is real
        self.clock = None if deployed else clock_for(config, task.client_ids)
        if self.hidden and self.clock is not None:
            raise FedkitError(
                "sites (simulated time) cannot run with dp.level=client at sample_fraction < 1: "
                "each round's simulated time and outages say which sites trained, and the "
                "epsilon is amplified on that sampling being secret; use sample_fraction=1 "
                "or leave sites unset"
            )
        #: FedBuff / FedAsync rounds (``aggregation``), see engines/asynchronous.py
        self.asynchronous: AsynchronousRounds | None = None
        if config["aggregation"] in ASYNCHRONOUS:
            cohort = cohort_size(len(task.client_ids), config["sample_fraction"])
            self.asynchronous = AsynchronousRounds(config, task.client_ids, cohort)
        if config["aggregation"] != "sync":  # a late or busy client must not hold up a score
            self.eval_with_fit = False

    @property
    def hook(self) -> Any:
        return self.plugins.hook

    @property
    def client_ids(self) -> list[str]:
        return list(self.task.client_ids)

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
        self.global_only = not self.plugins.active and not model.private_state()
        self.eval_with_fit = self.eval_with_fit and self.global_only

    def setup_clients(self, transport: Transport, ids: Iterable[str]) -> None:
        """Send the server priors; with ``task.shot_thresholds`` set, the clients' training
        class counts come back (the only statistic the setup shares) for the shot groups."""
        ids = list(ids)
        self.traffic = {}
        replies = self.send(transport, {cid: Message("setup", self.ctx.priors) for cid in ids})
        self.setup_traffic = self.traffic
        ok = self._failures("setup", 0, replies, required=len(ids))
        thresholds = self.config["task.shot_thresholds"]
        if thresholds and self.task.kind == CLASSIFICATION:
            counts = sum(replies[cid].arrays[CLASS_COUNTS].numpy() for cid in ok)
            self.task.shot_groups = shot_groups(np.asarray(counts), thresholds)

    # ------------------------------------------------------------------ rounds

    def run(self, transport: Transport, on_round: Callable[[Server], None] | None = None) -> None:
        """Run rounds ``next_round .. rounds``; ``on_round`` is called after each (checkpoints).

        With :attr:`eval_with_fit`, a round's evaluation goes to the clients with the next
        round's fit messages (one exchange instead of two; a client evaluates the global
        model before it trains on it, so the scores are the same), and the round is
        complete (recorded, checkpointed, reported) once those replies are in, before the
        next round aggregates. The last round evaluates on its own."""
        total = self.config["rounds"]
        self.observer.on_start(total, self.next_round)
        while self.next_round <= self.privacy.last_round:
            start = time.perf_counter()
            record = self.run_round(transport, self.next_round, on_round)
            record["seconds"] = round(time.perf_counter() - start, 3)
            self.seconds += record["seconds"]
            self.next_round += 1
            if record is not self.pending:
                self._complete(record, on_round)

    def _complete(self, record: dict[str, Any], on_round: Callable[[Server], None] | None) -> None:
        """Keep a round's finished ``record``, checkpoint and report it."""
        self.records.append(record)
        if on_round is not None:
            on_round(self)
        self.observer.on_round_end(record)

    def run_round(
        self,
        transport: Transport,
        rnd: int,
        on_round: Callable[[Server], None] | None = None,
    ) -> dict[str, Any]:
        """Train, aggregate and evaluate round ``rnd``; its record. A previous round's
        pending evaluation (:attr:`pending`) travels with the fit messages and that round
        is completed (``on_round``) before this one aggregates."""
        ctx, cfg = self.ctx, self.config
        ctx.round = rnd
        if self.asynchronous is not None:
            self.traffic = {}
            self.observer.on_phase(rnd, "train", 0, self.asynchronous.cohort)
            return self._round_end(transport, rnd, self.asynchronous.train(self, transport, rnd))
        sampled = self.privacy.sample(self.client_ids, rnd)
        if sampled is None:
            sampled = self._sample(rnd)
        self.observer.on_phase(rnd, "train", 0, len(sampled))
        self.traffic = {}
        messages = self.fit_messages(sampled, rnd)
        pending, self.pending = self.pending, None
        dp_state = ctx.states.setdefault("dp", {})
        if cfg["secagg.enabled"]:  # the server gets the clients' scalars and one sum
            replies, summed = self._secure_fit(transport, messages, rnd)
        elif pending is None:
            replies = self.send(transport, messages)
        else:
            replies = self._fit_and_evaluate(transport, messages, pending)
            self._complete(pending, on_round)
        ok = self._failures("fit", rnd, replies, required=self._required(len(messages)))
        if cfg["secagg.enabled"]:
            ok_replies = {cid: replies[cid] for cid in ok}
            updates = self.privacy.secure_updates(
                ctx.global_state, summed, ok_replies, dp_state, rnd
            )
        else:
            updates = [_update(cid, replies[cid]) for cid in ok]
            updates = self.privacy.updates(ctx.global_state, updates, dp_state, rnd)
        ctx.global_state = self.aggregate(updates, self._asker(transport, rnd, ok), rnd)
        record: dict[str, Any] = {"round": rnd, "global": {}, "clients": {}}
        if self.hidden:  # the count only: the names would undo the amplification by sampling
            record.update(sampled_count=len(sampled), trained_count=len(ok))
        else:
            record["sampled"] = sampled
            record["train"] = {
                cid: {
                    k: v
                    for k, v in private_scalars(replies[cid].scalars).items()
                    if k != "num_examples"
                }
                for cid in ok
            }
        return self._round_end(transport, rnd, record)

    def aggregate(
        self, updates: Sequence[Update], ask: Callable[..., dict[str, Reply]], rnd: int = 0
    ) -> Arrays:
        """The next global state from ``updates`` (``fedkit_aggregate``), checked (naming
        the plugin that made it, see :meth:`_check_state`)."""
        new_state, aggregator = self._aggregate(list(updates), ask)
        self._check_state(new_state, aggregator, rnd, updates)
        return {k: v.detach().cpu() for k, v in new_state.items()}

    def _round_end(self, transport: Transport, rnd: int, record: dict[str, Any]) -> dict[str, Any]:
        """Round ``rnd``'s traffic and simulated time into its ``record``, then its
        evaluation: now, or with the next round's fit messages (:attr:`pending`)."""
        cfg = self.config
        record["bytes"] = self.traffic
        if self.hidden:  # one total: each client's bytes say whether it trained
            record["bytes"] = {
                ALL_CLIENTS: {w: sum(c[w] for c in self.traffic.values()) for w in ("down", "up")}
            }
        if self.clock is not None:
            record["simulated_seconds"] = round(self.clock.now, 3)
            outages = self.clock.take_outages()
            if outages:
                record["outages"] = outages
        dp_state = self.ctx.states.setdefault("dp", {})
        privacy = self.privacy.record(rnd, dp_state)
        if privacy is not None:
            record["privacy"] = privacy
        if self.privacy.last(rnd, dp_state) or (
            rnd % cfg["eval_every"] == 0 and not self.eval_with_fit
        ):
            self.observer.on_phase(rnd, "evaluate", 0, len(self.client_ids))
            record.update(self.evaluate(transport, rnd))
        elif rnd % cfg["eval_every"] == 0:
            self.pending = record
        return record

    def _secure_fit(
        self, transport: Transport, messages: dict[str, Message], rnd: int
    ) -> tuple[dict[str, Message], Message]:
        """The fit exchange through the transport's secure aggregation: each client's reply
        scalars and the weighted mean of their updates (see :mod:`fedkit_core.privacy.secure`)."""
        secure = getattr(transport, "secure_fit", None)
        if secure is None:
            raise FedkitError("this engine's transport cannot aggregate securely (secagg.enabled)")
        replies, summed = secure(messages, rnd, self.config, self.ctx.global_state)
        for cid, message in messages.items():
            counts = self.traffic.setdefault(cid, {"down": 0, "up": 0})
            counts["down"] += message_bytes(message)
            counts["up"] += message_bytes(summed) if replies[cid].error is None else 0
        return replies, summed

    def _sample(self, rnd: int) -> list[str]:
        """The clients that train in round ``rnd``: a plugin's choice
        (``fedkit_select_clients``), else ``sample_fraction`` of them drawn from the seed."""
        chosen = self.hook.fedkit_select_clients(server=self.ctx, clients=self.client_ids)
        if chosen is None:
            cfg = self.config
            return sample_clients(self.client_ids, cfg["sample_fraction"], cfg["seed"], rnd)
        if isinstance(chosen, str) or not all(isinstance(c, str) for c in chosen):
            raise FedkitError(
                f"fedkit_select_clients returned {chosen!r}, not a list of client ids"
            )
        unknown = sorted(set(chosen) - set(self.client_ids))
        if unknown or not chosen:
            raise FedkitError(
                f"fedkit_select_clients chose {list(chosen)!r} in round {rnd}: "
                + (f"unknown clients {unknown}" if unknown else "no client")
            )
        return [cid for cid in self.client_ids if cid in set(chosen)]

    def _fit_and_evaluate(
        self, transport: Transport, messages: dict[str, Message], pending: dict[str, Any]
    ) -> dict[str, Message]:
        """Send the fit ``messages`` with the evaluation of the ``pending`` round (of the
        global state they carry) to every client: sampled clients get it inside their fit
        message, the others on its own. Records the evaluation in ``pending``; returns the
        fit replies."""
        rnd = pending["round"]
        splits = self._splits(rnd)
        evaluation = self._evaluation_message(rnd, splits, self.ctx.global_state)
        asked = Message("evaluate", scalars=evaluation.scalars)  # the fit carries the state
        combined = {
            cid: enclose(messages[cid], asked, EVALUATION) if cid in messages else evaluation
            for cid in self.client_ids
        }
        replies = self.send(transport, combined)
        fits: dict[str, Message] = {}
        evaluations: dict[str, Message] = {}
        for cid, reply in replies.items():
            if cid in messages:
                fits[cid], evaluations[cid] = take_out(reply, EVALUATION, "evaluate")
            else:
                evaluations[cid] = reply
        arrays, served = self._evaluation_results(rnd, evaluations)
        pending.update(self._evaluated(transport, rnd, splits, arrays, served))
        return fits

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
                **self.privacy.fit_scalars(self.ctx.states.setdefault("dp", {})),
                **{PAYLOAD + k: v for k, v in scalars.items()},
            },
        )

    def _required(self, sampled: int) -> int:
        wanted = self.config["min_clients"]
        if wanted is None and self.config["aggregation"] == "deadline":
            wanted = 1  # a deadline drops the late: a round needs one update at least
        return sampled if wanted is None else min(wanted, sampled)

    def _failures(
        self, phase: str, rnd: int, replies: dict[str, Message], required: int
    ) -> list[str]:
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

    def _asker(
        self, transport: Transport, rnd: int, default: list[str]
    ) -> Callable[..., dict[str, Reply]]:
        def ask(
            query: str,
            arrays: Arrays | None = None,
            scalars: dict | None = None,
            clients: Sequence[str] | None = None,
        ) -> dict[str, Reply]:
            if self.private:
                self.privacy.check_query(query)
            targets = list(clients) if clients is not None else default
            message = Message(
                "query",
                check_arrays(arrays or {}, query),
                {**(scalars or {}), "query": query, "round": rnd},
            )
            self.observer.on_phase(rnd, query, 0, len(targets))
            replies = self.send(transport, {cid: message for cid in targets})
            ok = self._failures(query, rnd, replies, required=self._required(len(targets)))
            return {cid: Reply(replies[cid].arrays, replies[cid].scalars) for cid in ok}

        return ask

    def _aggregate(self, updates: list[Update], ask: Callable[..., Any]) -> tuple[Any, str]:
        """The new global state by ``fedkit_aggregate`` (the first implementation, in call
        order, that returns one) and the name of the plugin that made it."""
        hook = self.hook.fedkit_aggregate
        impls = hook.get_hookimpls()
        if any(getattr(i, "hookwrapper", False) or getattr(i, "wrapper", False) for i in impls):
            owners = [i.plugin_name for i in impls if i.plugin_name not in BUILTINS]
            return hook(server=self.ctx, updates=updates, ask=ask), " or ".join(owners)
        kwargs = {"server": self.ctx, "updates": updates, "ask": ask}
        for impl in reversed(impls):  # pluggy's call order
            state = impl.function(*(kwargs[name] for name in impl.argnames))
            if state is not None:
                return state, impl.plugin_name
        return None, "no plugin"

    def _check_state(
        self, state: Any, aggregator: str = "", rnd: int = 0, updates: Sequence[Update] = ()
    ) -> None:
        """Refuse an aggregate of the wrong kind, keys or values (NaN or inf), naming the
        plugin that made it, or the clients whose updates were not finite already (a
        non-finite state would fail the next round's clients, as if their learning rate
        were too high)."""
        if not isinstance(state, dict):
            raise FedkitError(
                f"fedkit_aggregate ({aggregator}) returned {type(state).__name__}, not a dict "
                "of tensors"
            )
        expected = set(self.ctx.global_state)
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise FedkitError(
                f"the aggregator ({aggregator}) returned a different state: missing "
                f"{missing[:5]}, extra {extra[:5]}"
            )
        broken = [key for key, value in state.items() if not _finite(value)]
        if not broken:
            return
        senders = [u.client_id for u in updates if not all(map(_finite, u.arrays.values()))]
        if senders:
            raise FedkitError(
                f"the updates of {', '.join(map(repr, senders))} in round {rnd} hold values "
                f"that are not finite (NaN or inf), and so does their aggregate"
            )
        raise FedkitError(
            f"the aggregate of round {rnd} made by plugin {aggregator!r} "
            f"(fedkit_aggregate) holds values that are not finite (NaN or inf) in "
            f"{', '.join(broken[:5])}{', ...' if len(broken) > 5 else ''}, from clients' "
            "updates that are finite: a fault in that plugin's aggregation (e.g. weights "
            "that are NaN or sum to 0)"
        )

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, transport: Transport, rnd: int) -> dict[str, Any]:
        """Every client evaluates the new global model (and its own views); metrics per
        split, view and scope. Validation is scored in every evaluated round, the test split
        with ``eval_test=every`` in every one too; with ``improved`` only in the last round
        and in the round that :func:`best_round` (the choice of ``final.best``) reports, so
        the final and best-round results are those of ``every``.

        A round whose validation makes it the best so far is tested at once when clients
        evaluate with state of their own (plugins, private model entries); else evaluation
        depends on the global model alone, which is kept (:attr:`best_state`) and tested in
        the last round only if no later round did better (its record gets the test scopes
        then), so a run tests the test split once or twice."""
        splits = self._splits(rnd)
        arrays, served = self._evaluate(transport, rnd, splits, self.ctx.global_state)
        return self._evaluated(transport, rnd, splits, arrays, served)

    def _splits(self, rnd: int) -> str:
        """The splits round ``rnd`` evaluates first: validation, and test where
        ``eval_test`` asks for it in every evaluated round, and in the last round."""
        if self.config["eval_test"] == "every" or rnd == self.privacy.last_round:
            return "val,test"
        return "val"

    def _evaluated(
        self,
        transport: Transport,
        rnd: int,
        splits: str,
        arrays: dict[str, dict[str, np.ndarray]],
        served: dict[str, str],
    ) -> dict[str, Any]:
        """The evaluation entries of round ``rnd``'s record from the clients' replies for
        ``splits`` (see :meth:`evaluate`); asks for the test split where it must."""
        every = self.config["eval_test"] == "every"
        val = self._scopes(arrays, served, "val")
        if "test" in splits.split(","):
            if not every and not self._improves(rnd, val):
                self._test_kept_best(transport, rnd, val)
        else:
            if not self._improves(rnd, val):
                return {"evaluated": ["val"], "val": val}
            if self.global_only:
                state = {k: v.clone() for k, v in self.ctx.global_state.items()}
                self.best_state = {"round": rnd, "state": state}
                return {"evaluated": ["val"], "val": val}
            arrays, served = self._evaluate(transport, rnd, "test", self.ctx.global_state)
        test = self._scopes(arrays, served, "test")
        return {"evaluated": ["val", "test"], **test, "val": val}

    def _test_kept_best(self, transport: Transport, last: int, val: Mapping[str, Any]) -> None:
        """Score the test split of the kept best round's global model into its record (the
        ``last`` round, of validation scopes ``val``, did not do better)."""
        kept = self.best_state
        if kept is None or self._best_so_far(last, val) != kept["round"]:
            return
        rnd = self.best_state["round"]
        arrays, served = self._evaluate(transport, rnd, "test", self.best_state["state"])
        record = next(r for r in self.records if r["round"] == rnd)
        record.update({"evaluated": ["val", "test"], **self._scopes(arrays, served, "test")})

    def _evaluate(
        self, transport: Transport, rnd: int, splits: str, state: Arrays
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
        """Send every client an ``evaluate`` message of the global ``state`` of round
        ``rnd`` for ``splits``; the replies' arrays and the view that scores each client."""
        message = self._evaluation_message(rnd, splits, state)
        replies = self.send(transport, {cid: message for cid in self.client_ids})
        return self._evaluation_results(rnd, replies)

    def _evaluation_message(self, rnd: int, splits: str, state: Arrays) -> Message:
        return Message("evaluate", state, {"round": rnd, "splits": splits, "mode": self.evaluation})

    def _evaluation_results(
        self, rnd: int, replies: dict[str, Message]
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
        """The arrays of every client's evaluation reply and the view that scores it."""
        ok = self._failures("evaluate", rnd, replies, required=self._required(len(self.client_ids)))
        served = {cid: str(replies[cid].scalars["view"]) for cid in ok}
        arrays = {cid: {k: v.numpy() for k, v in replies[cid].arrays.items()} for cid in ok}
        return arrays, served

    def _improves(self, rnd: int, val: Mapping[str, Any]) -> bool:
        """Whether round ``rnd``'s validation scopes make it the best round so far."""
        return self._best_so_far(rnd, val) == rnd

    def _best_so_far(self, rnd: int, val: Mapping[str, Any]) -> int | None:
        """The best round on validation of the records and round ``rnd`` (scopes ``val``)."""
        evaluated = [r for r in self.records if "val" in r] + [{"round": rnd, "val": val}]
        best = best_round(evaluated, self.task.main_metric)
        return None if best is None else best[0]["round"]

    def _scopes(
        self,
        arrays: dict[str, dict[str, np.ndarray]],
        served: dict[str, str],
        split: str,
    ) -> dict[str, Any]:
        per_view = _by_view(arrays, split)
        combine = _sum_stats if self.evaluation == "federated" else _concat
        views: dict[str, Any] = {}
        predicted = None
        for view, clients in per_view.items():
            scores = {cid: self._metrics(values) for cid, values in clients.items()}
            pooled = combine(list(clients.values()))
            views[view] = {"global": self._metrics(pooled), "clients": scores}
            if view == "global":
                predicted = predicted_classes(pooled)
        clients_scope = {
            cid: views[view]["clients"][cid]
            for cid, view in served.items()
            if view in views and cid in views[view]["clients"]
        }
        main = self.task.main_metric
        scopes: dict[str, Any] = {
            "global": views.get("global", {}).get("global", {}),
            "clients": clients_scope,
            "clients_mean": _mean_metrics(clients_scope.values()),
            "fairness": fairness(clients_scope, main),
            "views": views,
        }
        summary: dict[str, float] = {}
        for impl in reversed(self.hook.fedkit_summary.get_hookimpls()):  # pluggy's order
            kwargs = {"server": self.ctx, "scopes": scopes}
            part = impl.function(*(kwargs[name] for name in impl.argnames)) or {}
            for name, value in dict(part).items():
                if name in CSV_COLUMNS or name in scopes["clients_mean"]:  # its csv row's
                    self._warn_shadow(impl.plugin_name, name)
                else:
                    summary[name] = value
        scopes["summary"] = summary
        if predicted is not None:  # read by results.json's warnings (one class predicted)
            scopes["predicted_classes"] = predicted
            scopes["one_class_sites"] = one_class_sites(per_view, served)
        return scopes

    def _metrics(self, arrays: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The metrics of one scope: the built-in ones, then each plugin's. A plugin's metric
        named like a built-in one does not replace it, and one that is not finite (NaN,
        inf) is recorded as missing, each with a warning naming the plugin; one that is not
        a number is an error naming it."""
        out: dict[str, float] = {}
        builtin: set[str] = set()
        for impl in self.hook.fedkit_metrics.get_hookimpls():  # built-ins (trylast) first
            kwargs = {"server": self.ctx, "arrays": arrays}
            part = impl.function(*(kwargs[name] for name in impl.argnames)) or {}
            plugin = impl.plugin_name
            if plugin in BUILTINS:
                builtin.update(part)
                out.update(part)
                continue
            if not isinstance(part, Mapping):
                raise FedkitError(
                    f"plugin {plugin!r}: fedkit_metrics returned a {type(part).__name__}, "
                    "not a mapping of metric names to numbers"
                )
            for name, value in part.items():
                if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                    raise FedkitError(
                        f"plugin {plugin!r}: its metric {str(name)[:80]!r} is "
                        f"{str(value)[:80]!r} ({type(value).__name__}), not a number"
                    )
                if name in builtin or name in CSV_COLUMNS:
                    self._warn_shadow(plugin, name)
                elif not math.isfinite(float(value)):
                    self._warn_once(
                        (plugin, name, "finite"),
                        f"plugin {plugin!r} gave {value} for its metric {name!r}: recorded "
                        "as missing where it is not finite",
                    )
                else:
                    out[name] = value
        return out

    def _warn_shadow(self, plugin: str, name: str) -> None:
        """Warn (once) that ``plugin``'s metric ``name``, the name of a built-in metric or
        metrics.csv column (round, epsilon, ...), is left out."""
        self._warn_once(
            (plugin, name, "shadow"),
            f"plugin {plugin!r} gives a metric {name!r}, the name of a built-in one, which "
            f"is kept: name the plugin's own '{plugin}.{name}'",
        )

    def _warn_once(self, key: tuple[str, ...], text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, Any]:
        return {
            "next_round": self.next_round,
            "global_state": self.ctx.global_state,
            "priors": self.ctx.priors,
            "server_state": self.ctx.states,
            "shot_groups": self.task.shot_groups,
            "records": self.records,
            "events": self.events,
            "seconds": self.seconds,
            "best_state": self.best_state,
            "config_edits": self.config_edits,
            "unverified": self.unverified,
            "clock": self.clock.state() if self.clock is not None else None,
            "asynchronous": self.asynchronous.state() if self.asynchronous else None,
        }

    def restore(self, snap: dict[str, Any]) -> None:
        self.next_round = snap["next_round"]
        self.ctx.global_state = snap["global_state"]
        self.ctx.states = snap["server_state"]
        self.task.shot_groups = snap["shot_groups"]
        self.records = snap["records"]
        self.events = snap["events"]
        self.seconds = snap["seconds"]
        self.best_state = snap.get("best_state")
        self.privacy.restore(self.ctx.states.get("dp", {}))
        self.config_edits = snap.get("config_edits", [])
        self.unverified = snap.get("unverified", [])
        if self.clock is not None and snap.get("clock") is not None:
            self.clock.restore(snap["clock"])
        if self.asynchronous is not None and snap.get("asynchronous") is not None:
            self.asynchronous.restore(snap["asynchronous"])


def _update(cid: str, reply: Message) -> Update:
    """A client's fit reply as an :class:`Update`: the model's arrays and the scalars, and
    apart the arrays plugins sent up (:data:`PAYLOAD`)."""
    fit, sent = take_out(reply, PAYLOAD, "fit")
    return Update(cid, fit.arrays, fit.scalars, payload=sent.arrays)


def _finite(value: Any) -> bool:
    """Whether a message array holds no NaN or inf (arrays that are not floats always do)."""
    tensor = torch.as_tensor(value)
    return not tensor.is_floating_point() or bool(tensor.isfinite().all())


def _mean_metrics(metrics: Iterable[dict[str, float]]) -> dict[str, float]:
    """Unweighted mean over clients of each metric (over the clients reporting it)."""
    collected: dict[str, list[float]] = {}
    for m in metrics:
        for key, value in m.items():
            collected.setdefault(key, []).append(value)
    return {key: float(np.mean(values)) for key, values in collected.items()}


def one_class_sites(
    per_view: Mapping[str, Mapping[str, Mapping[str, np.ndarray]]], served: Mapping[str, str]
) -> dict[str, int]:
    """``{client id: class}`` of the sites whose model (the view that served it) predicted
    one class for every test image there: read by results.json's warnings. Only the class
    is kept, not the classes each site's model predicted (less about a site's data)."""
    out = {}
    for cid, view in served.items():
        found = predicted_classes(per_view.get(view, {}).get(cid, {}))
        if found is not None and len(found) == 1:
            out[cid] = found[0]
    return out


def _by_view(
    arrays: dict[str, dict[str, np.ndarray]], split: str
) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """``{view: {client id: {name: array}}}`` of one split's evaluation arrays; the labels
    (pooled mode) go with every view."""
    out: dict[str, dict[str, dict[str, np.ndarray]]] = defaultdict(dict)
    for cid, named in arrays.items():
        labels = named.get(f"{split}/labels")
        for key, value in named.items():
            parts = key.split("/")
            if parts[0] != split or len(parts) != 3:
                continue
            entry = out[parts[1]].setdefault(cid, {} if labels is None else {"labels": labels})
            entry[parts[2]] = value
    return out


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _sum_stats(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return functools.reduce(add_stats, parts)
