"""The server side of the protocol: rounds, sampling, aggregation, evaluation, records.

The server talks to clients only through a :class:`Transport` (``send`` a message per
client id, get a reply per client id). The in-process engine delivers messages by direct
calls; the Flower engine wraps them in Flower messages. Everything else is shared.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.engines.client import build_model
from fedkit_core.engines.context import ModelContext, ServerContext, derive_seed
from fedkit_core.errors import ClientFailure, FedkitError
from fedkit_core.messages import Arrays, Message, Reply, Update, check_arrays
from fedkit_core.metrics.fairness import fairness
from fedkit_core.plugins import PluginSet
from fedkit_core.tasks.base import TaskInfo


class Transport(Protocol):
    """Delivers one message per client id and returns the replies (``error`` set on failure)."""

    def send(self, messages: dict[str, Message]) -> dict[str, Message]: ...


class Observer:
    """Receives progress events (the CLI shows them); every method is optional."""

    def on_start(self, total_rounds: int, first_round: int) -> None: ...

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None: ...

    def on_round_end(self, record: dict[str, Any]) -> None: ...


def lr_at(config: Config, round: int) -> float:
    """The learning rate of a (1-based) round under the ``lr_schedule`` config keys."""
    lr, gamma = config["lr"], config["lr_gamma"]
    if config["lr_schedule"] == "step":
        return lr * gamma ** sum(round >= m for m in config["lr_milestones"])
    if config["lr_schedule"] == "exp":
        return lr * gamma ** (round - 1)
    return lr


def sample_clients(ids: Sequence[str], fraction: float, seed: int, round: int) -> list[str]:
    """A deterministic sample of ``max(1, round(fraction * n))`` clients, in id order."""
    k = min(len(ids), max(1, int(round_half_up(fraction * len(ids)))))
    if k == len(ids):
        return list(ids)
    rng = np.random.default_rng(derive_seed(seed, "sample", round))
    chosen = set(rng.choice(len(ids), size=k, replace=False).tolist())
    return [cid for i, cid in enumerate(ids) if i in chosen]


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


class Server:
    """Runs the federation over a transport and keeps the per-round records."""

    def __init__(
        self,
        config: Config,
        plugins: PluginSet,
        task: TaskInfo,
        device: torch.device,
        observer: Observer | None = None,
    ):
        self.config = config
        self.plugins = plugins
        self.task = task
        self.observer = observer or Observer()
        self.ctx = ServerContext(task, config, device)
        self.records: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.next_round = 1
        self.seconds = 0.0

    @property
    def hook(self) -> Any:
        return self.plugins.hook

    @property
    def client_ids(self) -> list[str]:
        return list(self.task.clients)

    # ------------------------------------------------------------------ setup

    def setup(self, priors: Arrays | None = None) -> None:
        """Check plugins, build server priors and the initial global state."""
        problems: list[str] = []
        for result in self.hook.fedkit_check(task=self.task, config=self.config):
            if result:
                problems += [result] if isinstance(result, str) else list(result)
        if problems:
            raise FedkitError("\n".join(problems))
        if priors is None:
            priors = {}
            for part in self.hook.fedkit_server_priors(task=self.task, config=self.config):
                priors.update(check_arrays(dict(part or {}), "fedkit_server_priors"))
        self.ctx.priors = priors
        torch.manual_seed(derive_seed(self.config["seed"], "model", "server"))
        model = build_model(self.plugins, ModelContext(self.task, self.config, None, priors))
        self.ctx.global_state = model.shared_state()

    def setup_clients(self, transport: Transport, ids: Iterable[str]) -> None:
        ids = list(ids)
        replies = transport.send({cid: Message("setup", self.ctx.priors) for cid in ids})
        self._failures("setup", 0, replies, required=len(ids))

    # ------------------------------------------------------------------ rounds

    def run(self, transport: Transport, on_round: Callable[[Server], None] | None = None) -> None:
        """Run rounds ``next_round .. rounds``; ``on_round`` is called after each (checkpoints)."""
        total = self.config["rounds"]
        self.observer.on_start(total, self.next_round)
        while self.next_round <= total:
            start = time.perf_counter()
            record = self.run_round(transport, self.next_round)
            record["seconds"] = round(time.perf_counter() - start, 3)
            self.seconds += record["seconds"]
            self.records.append(record)
            self.next_round += 1
            if on_round is not None:
                on_round(self)
            self.observer.on_round_end(record)

    def run_round(self, transport: Transport, rnd: int) -> dict[str, Any]:
        ctx, cfg = self.ctx, self.config
        ctx.round = rnd
        sampled = sample_clients(self.client_ids, cfg["sample_fraction"], cfg["seed"], rnd)
        self.observer.on_phase(rnd, "train", 0, len(sampled))
        fit = Message("fit", ctx.global_state, {"round": rnd, "lr": lr_at(cfg, rnd)})
        replies = transport.send({cid: fit for cid in sampled})
        ok = self._failures("fit", rnd, replies, required=self._required(len(sampled)))
        updates = [Update(cid, replies[cid].arrays, replies[cid].scalars) for cid in ok]
        new_state = self.hook.fedkit_aggregate(
            server=ctx, updates=updates, ask=self._asker(transport, rnd, ok)
        )
        self._check_state(new_state)
        ctx.global_state = {k: v.detach().cpu() for k, v in new_state.items()}
        record: dict[str, Any] = {
            "round": rnd,
            "sampled": sampled,
            "train": {
                cid: {k: v for k, v in replies[cid].scalars.items() if k != "num_examples"}
                for cid in ok
            },
            "global": {},
            "clients": {},
        }
        if rnd % cfg["eval_every"] == 0 or rnd == cfg["rounds"]:
            self.observer.on_phase(rnd, "evaluate", 0, len(self.client_ids))
            record.update(self.evaluate(transport, rnd))
        return record

    def _required(self, sampled: int) -> int:
        wanted = self.config["min_clients"]
        return sampled if wanted is None else min(wanted, sampled)

    def _failures(
        self, phase: str, rnd: int, replies: dict[str, Message], required: int
    ) -> list[str]:
        ok = [cid for cid, msg in replies.items() if msg.error is None]
        failed = {cid: msg for cid, msg in replies.items() if msg.error is not None}
        for cid, msg in failed.items():
            self.events.append({"round": rnd, "phase": phase, "client": cid, "error": msg.error})
        if len(ok) < required:
            cid, msg = next(iter(failed.items()))
            if isinstance(msg.exception, FedkitError):
                raise msg.exception
            raise ClientFailure(cid, rnd, msg.error) from msg.exception
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
            targets = list(clients) if clients is not None else default
            message = Message(
                "query",
                check_arrays(arrays or {}, query),
                {**(scalars or {}), "query": query, "round": rnd},
            )
            self.observer.on_phase(rnd, query, 0, len(targets))
            replies = transport.send({cid: message for cid in targets})
            ok = self._failures(query, rnd, replies, required=self._required(len(targets)))
            return {cid: Reply(replies[cid].arrays, replies[cid].scalars) for cid in ok}

        return ask

    def _check_state(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise FedkitError(
                f"fedkit_aggregate returned {type(state).__name__}, not a dict of tensors"
            )
        expected = set(self.ctx.global_state)
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise FedkitError(
                f"the aggregator returned a different state: missing {missing[:5]}, extra {extra[:5]}"
            )

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, transport: Transport, rnd: int) -> dict[str, Any]:
        """Every client evaluates the new global model; metrics per split and scope."""
        message = Message("evaluate", self.ctx.global_state, {"round": rnd, "splits": "val,test"})
        replies = transport.send({cid: message for cid in self.client_ids})
        ok = self._failures("evaluate", rnd, replies, required=self._required(len(self.client_ids)))
        arrays = {cid: {k: v.numpy() for k, v in replies[cid].arrays.items()} for cid in ok}
        test = self._scopes(arrays, "test")
        val = self._scopes(arrays, "val")
        return {**test, "val": val}

    def _scopes(self, arrays: dict[str, dict[str, np.ndarray]], split: str) -> dict[str, Any]:
        def pick(cid: str, view: str) -> dict[str, np.ndarray] | None:
            out = {}
            for key, value in arrays[cid].items():
                parts = key.split("/")
                if parts[0] != split:
                    continue
                if parts[1] == "labels":
                    out["labels"] = value
                elif parts[1] == view:
                    out[parts[2]] = value
            return out if any(k != "labels" for k in out) else None

        pooled: dict[str, list[np.ndarray]] = {}
        clients: dict[str, dict[str, float]] = {}
        for cid in arrays:
            own = pick(cid, "global")
            if own is None:
                continue
            for key, value in own.items():
                pooled.setdefault(key, []).append(value)
            mine = pick(cid, "personal") or own
            clients[cid] = self._metrics(mine)
        glob = self._metrics({k: np.concatenate(v) for k, v in pooled.items()}) if pooled else {}
        main = self.task.main_metric
        scopes: dict[str, Any] = {
            "global": glob,
            "clients": clients,
            "clients_mean": _mean_metrics(clients.values()),
            "fairness": fairness(clients, main),
        }
        summary: dict[str, float] = {}
        for part in self.hook.fedkit_summary(task=self.task, scopes=scopes):
            summary.update(part or {})
        scopes["summary"] = summary
        return scopes

    def _metrics(self, arrays: dict[str, np.ndarray]) -> dict[str, float]:
        out: dict[str, float] = {}
        for part in reversed(self.hook.fedkit_metrics(task=self.task, arrays=arrays)):
            out.update(part or {})
        return out

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, Any]:
        return {
            "next_round": self.next_round,
            "global_state": self.ctx.global_state,
            "priors": self.ctx.priors,
            "server_state": self.ctx.state,
            "records": self.records,
            "events": self.events,
            "seconds": self.seconds,
        }

    def restore(self, snap: dict[str, Any]) -> None:
        self.next_round = snap["next_round"]
        self.ctx.global_state = snap["global_state"]
        self.ctx.state = snap["server_state"]
        self.records = snap["records"]
        self.events = snap["events"]
        self.seconds = snap["seconds"]


def _mean_metrics(metrics: Iterable[dict[str, float]]) -> dict[str, float]:
    """Unweighted mean over clients of each metric (over the clients reporting it)."""
    collected: dict[str, list[float]] = {}
    for m in metrics:
        for key, value in m.items():
            collected.setdefault(key, []).append(value)
    return {key: float(np.mean(values)) for key, values in collected.items()}
