"""How the local engine reaches its clients: in this process (:class:`LocalTransport`), or in
worker processes (:class:`WorkerTransport`: parallel clients, timeouts, retries).

:class:`WorkerTransport` forks ``N`` worker processes after the clients are built (the
isolation every engine uses for a stoppable client, :mod:`fedkit_core.engines.isolation`); client
``k`` (in id order) lives in worker ``k mod N`` for the whole run, so its state (model,
private entries, optimiser, plugin state, checkpoint folder) is in exactly one process.
The server sends each worker its clients' messages one at a time and waits for the reply:

* a client that raises gets a failed reply, as in-process; its worker restores it to its
  state before the message (:func:`deliver`);
* a client that does not reply within ``client_timeout`` seconds, or whose process exits
  (``os._exit``, a segfault, the kernel's OOM killer), fails too: its worker is killed and
  forked afresh from the engine's process, and the clients it served are rebuilt there
  (``setup`` again, then the snapshot each shipped back after its last state change);
* a failed message is re-sent up to ``client_retries`` times, always from the client's
  state before it. Training is seeded per client and round (never per attempt, never by
  what ran before in the process), so a retry that succeeds gives the reply a first try
  would have given, and N workers give the results of serial clients bit for bit.

Snapshots are shipped back only when the run survives a failed client (``min_clients`` set
or ``client_retries`` > 0; otherwise the first failure stops the run anyway), and only
their round when the run checkpoints: the worker has just written them to the client's
checkpoint folder, where its successor reads them.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

import torch

from fedkit_core.contract.messages import Message
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.checkpoint import RESUME_KEY, ClientCheckpoints, checkpoint_client
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.isolation import Isolated, Stopped, dumps, timeout_text
from fedkit_core.engines.snapshot import client_snapshot, restore_client
from fedkit_core.errors import FedkitError, failure_text, no_space

log = logging.getLogger("fedkit")

#: the fewest cores on which ``local.workers=auto`` runs clients in parallel: on 2 cores the
#: engine's process (aggregation, pooled evaluation, pickling the messages) would compete
#: with the workers, and a gain there is not established (see docs/engines.md)
AUTO_MIN_CORES = 4


def parse_workers(value: Any) -> int | None:
    """``local.workers``: a count >= 0 (0: clients run in the engine's process) or ``auto``
    (None)."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise FedkitError(f"config key 'local.workers' must be auto or a count >= 0, got {value!r}")
    return count


def auto_workers(
    sampled: int, cores: int, threads: int, device: torch.device, objects: bool = False
) -> int:
    """The worker processes ``local.workers=auto`` uses: as many as the cores hold at
    ``threads`` intra-op threads each, at most one per sampled client, when that is at
    least 2, on the CPU, with at least :data:`AUTO_MIN_CORES` cores, and no throwaway plugin
    ``objects`` (``run(plugins=...)``); else 0 (clients in the engine's process).

    Each worker keeps the engine process's thread count, so parallel clients change no
    result (torch's kernels may sum in an order that depends on the thread count); they
    use cores that one client's intra-op threads would leave idle. A throwaway plugin
    object may record what its hooks saw in itself, which a worker's copy would hide from
    its caller (tests do), so those runs stay in-process unless ``local.workers`` is set.
    Splitting the threads instead (``local.threads``) is the user's choice:
    ``benchmarks/parallel_clients.py`` measures both on the anchor job."""
    if device.type != "cpu" or objects or cores < AUTO_MIN_CORES:
        return 0
    count = min(sampled, cores // max(threads, 1))
    return count if count >= 2 else 0


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------- one message


def deliver(
    client: ClientRuntime,
    message: Message,
    store: ClientCheckpoints | None,
    *,
    keep_before: bool,
    snapshot: bool = False,
) -> tuple[Message, dict[str, Any] | None]:
    """``client`` handles ``message`` and checkpoints itself in ``store``. Returns the reply
    and the client's snapshot when it changed (with ``snapshot`` even without a store).

    A raising client becomes a failed reply (``error`` set, the exception kept); with
    ``keep_before`` it is first brought back to its state before the message, as a Flower
    node's context keeps its last state, so a retry starts where the first try did and a
    tolerated failure leaves no half-trained state."""
    before = _state_before(client, message) if keep_before else None
    try:
        reply = client.handle(message)
        taken = None
        if store is not None or snapshot:
            taken = checkpoint_client(client, message, store)
        return reply, taken
    except (Exception, SystemExit) as err:  # recorded; the server decides if the round survives
        if before is not None:
            restore_client(client, before)
        return _failed(message, err), None


def _failed(message: Message, err: BaseException) -> Message:
    """The failed reply to ``message``: the error's text, the exception kept. A client that
    calls ``sys.exit`` fails alone, as on Flower's thread backend (same wording)."""
    err = no_space(err)
    return Message(message.kind, error=failure_text(err), exception=err)


def _state_before(client: ClientRuntime, message: Message) -> dict[str, Any] | None:
    """A copy of ``client``'s snapshot before a message that changes its state."""
    if message.kind not in ("fit", "query") or not client.set_up:
        return None
    dirty = client.dirty
    snapshot = copy.deepcopy(client_snapshot(client))
    client.dirty = dirty  # taking the snapshot is no checkpoint
    return snapshot


def tolerant(config: Mapping[str, Any]) -> bool:
    """Whether a run goes on after a failed client message (retried or tolerated)."""
    return config["client_retries"] > 0 or config["min_clients"] is not None


def with_attempts(error: str, attempts: int) -> str:
    return error if attempts == 1 else f"{error} (failed {attempts} attempts)"


# ---------------------------------------------------------------------------- the worker


def _answerer(
    clients: dict[str, ClientRuntime],
    stores: dict[str, ClientCheckpoints] | None,
    keep: bool,
) -> Callable[[tuple[str, Message, Any]], tuple[Message, dict[str, Any] | None]]:
    """What a worker process does with a ``(client id, message, rebuild)`` request: the
    reply and the client's snapshot (see :func:`deliver`)."""

    def answer(request: tuple[str, Message, Any]) -> tuple[Message, dict[str, Any] | None]:
        cid, message, rebuild = request
        client = clients[cid]
        store = stores[cid] if stores is not None else None
        try:
            if rebuild is not None:  # this process was forked afresh: set the client up again
                setup, snapshot = rebuild
                client.handle(setup)
                if snapshot is not None and STORED in snapshot:
                    snapshot = store.load(snapshot[STORED])
                if snapshot is not None:
                    restore_client(client, snapshot)
        except Exception as err:
            reply, taken = _failed(message, err), None
        else:
            reply, taken = deliver(client, message, store, keep_before=keep, snapshot=keep)
            if taken is not None and store is not None:  # in its checkpoint folder already
                taken = {STORED: taken["round"]}
        return _portable(reply), taken

    return answer


#: a shipped-back snapshot that is the newest of its round in the client's checkpoint folder
STORED = "stored_round"


def _portable(reply: Message) -> Message:
    """``reply`` with an exception that survives pickling (else a stand-in of its kind:
    a FedkitError stays one, anything else stays a bug), its traceback in the worker kept
    as a note (``--debug`` shows it)."""
    err = reply.exception
    if err is None:
        return reply
    if err.__traceback__ is not None:
        err.add_note("in the client's worker process:\n" + "".join(traceback.format_exception(err)))
    try:
        pickle.loads(dumps(err))
    except Exception:
        kind = FedkitError if isinstance(err, FedkitError) else RuntimeError
        reply.exception = kind(reply.error)
    return reply


# ---------------------------------------------------------------------------- the server side


@dataclass
class _Worker:
    isolated: Isolated
    clients: list[str]
    queue: deque[str] = field(default_factory=deque)
    busy: str | None = None  # the client whose message is in flight
    deadline: float = float("inf")


class LocalTransport:
    """Delivers messages by calling each client's ``handle`` in this process, one client
    after the other (see :func:`deliver`): a raising client
    becomes a failed reply (``error`` set, the exception kept for in-process re-raising),
    re-sent up to ``client_retries`` times from its state before the message. With
    ``stores``, each client checkpoints itself there (see :func:`checkpoint_client`)."""

    def __init__(
        self,
        clients: dict[str, ClientRuntime],
        observer: Observer,
        stores: dict[str, ClientCheckpoints] | None = None,
    ):
        self.clients = clients
        self.observer = observer
        self.stores = stores

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        replies: dict[str, Message] = {}
        for done, (cid, message) in enumerate(messages.items(), start=1):
            client = self.clients[cid]
            store = self.stores[cid] if self.stores is not None else None
            config = client.ctx.config
            for attempt in range(1, config["client_retries"] + 2):
                reply, _ = deliver(client, message, store, keep_before=tolerant(config))
                if reply.error is None or attempt > config["client_retries"]:
                    break
                log.warning("client %s: %s; retrying", cid, reply.error)
            if reply.error is not None:
                reply.error = with_attempts(reply.error, attempt)
            replies[cid] = reply
            phase = str(message.scalars.get("query", message.kind))
            self.observer.on_phase(int(message.scalars.get("round", 0)), phase, done, len(messages))
        return replies


class WorkerTransport:
    """Delivers messages to clients living in ``count`` :class:`~fedkit_core.engines.isolation.Isolated`
    worker processes (see the module docstring). Call :meth:`close` when the run ends."""

    def __init__(
        self,
        clients: dict[str, ClientRuntime],
        observer: Observer,
        stores: dict[str, ClientCheckpoints] | None,
        config: Mapping[str, Any],
        count: int,
        threads: int,
    ):
        self.clients = clients
        self.observer = observer
        self.stores = stores
        self.timeout: float | None = config["client_timeout"]
        self.retries: int = config["client_retries"]
        self.keep = tolerant(config)
        self.threads = threads
        self.home: dict[str, int] = {cid: k % count for k, cid in enumerate(clients)}
        self.setups: dict[str, Message] = {}  # each client's setup message (for rebuilds)
        #: each client's last state, shipped back (or where in its checkpoint folder it is)
        self.snapshots: dict[str, dict[str, Any] | None] = {}
        self.stale: set[str] = set()  # clients whose worker was forked afresh since setup
        self.workers: list[_Worker] = []
        for k in range(count):
            self.workers.append(self._fork(k))

    def _fork(self, k: int) -> _Worker:
        answer = _answerer(self.clients, self.stores, self.keep)
        isolated = Isolated(answer, threads=self.threads, name=f"fedkit-worker-{k}")
        return _Worker(isolated, [cid for cid, home in self.home.items() if home == k])

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        results: dict[str, Message] = {}
        attempts = dict.fromkeys(messages, 0)
        for cid in messages:
            self.workers[self.home[cid]].queue.append(cid)
        while len(results) < len(messages):
            lost: list[tuple[int, str, Message]] = []
            for k, worker in enumerate(self.workers):
                if worker.busy is None and worker.queue:
                    lost += self._start(k, worker.queue.popleft(), messages)
            for k, cid, reply in lost or self._next_replies():
                attempts[cid] += 1
                reply.kind = reply.kind or messages[cid].kind
                if reply.error is not None and attempts[cid] <= self.retries:
                    log.warning("client %s: %s; retrying", cid, reply.error)
                    self.workers[k].queue.appendleft(cid)
                    continue
                if reply.error is not None:
                    reply.error = with_attempts(reply.error, attempts[cid])
                results[cid] = reply
                message = messages[cid]
                phase = str(message.scalars.get("query", message.kind))
                round_ = int(message.scalars.get("round", 0))
                self.observer.on_phase(round_, phase, len(results), len(messages))
        return {cid: results[cid] for cid in messages}

    def _start(
        self, k: int, cid: str, messages: dict[str, Message]
    ) -> list[tuple[int, str, Message]]:
        """Send ``cid``'s message to its worker ``k`` (rebuilding the client there first
        when the worker was forked afresh since the client's setup). A worker found dead
        while idle is replaced, and the message fails as if it had died with it."""
        message = messages[cid]
        if message.kind == "setup":
            scalars = {key: v for key, v in message.scalars.items() if key != RESUME_KEY}
            self.setups[cid] = Message("setup", message.arrays, scalars)
            self.stale.discard(cid)
        request = (cid, message, None)
        if cid in self.stale:
            request = (cid, message, (self.setups[cid], self.snapshots.get(cid)))
        try:
            self.workers[k].isolated.send(request)
        except Stopped as stopped:
            self._replace(k)
            return [(k, cid, Message("", error=str(stopped)))]
        self.stale.discard(cid)
        worker = self.workers[k]
        worker.busy = cid
        worker.deadline = time.monotonic() + self.timeout if self.timeout else float("inf")
        return []

    def _next_replies(self) -> list[tuple[int, str, Message]]:
        """Wait for the next replies of busy workers, as ``(worker, client id, reply)``:
        answers, exits and timeouts (the worker then replaced)."""
        busy = [k for k, w in enumerate(self.workers) if w.busy is not None]
        deadline = min(self.workers[k].deadline for k in busy)
        left = None if deadline == float("inf") else max(0.0, deadline - time.monotonic())
        ready = set(wait([h for k in busy for h in self.workers[k].isolated.waitables], left))
        out: list[tuple[int, str, Message]] = []
        for k in busy:
            worker = self.workers[k]
            cid = worker.busy
            assert cid is not None
            if ready & set(worker.isolated.waitables):
                try:
                    reply, snapshot = worker.isolated.receive()
                except Stopped as stopped:
                    error = str(stopped)
                else:
                    if snapshot is not None and self.keep:
                        self.snapshots[cid] = snapshot
                    worker.busy, worker.deadline = None, float("inf")
                    out.append((k, cid, reply))
                    continue
            elif time.monotonic() >= worker.deadline:
                error = timeout_text(self.timeout or 0.0)
            else:
                continue
            self._replace(k)
            out.append((k, cid, Message("", error=error)))
        return out

    def _replace(self, k: int) -> None:
        """Kill worker ``k`` and fork its successor, which takes over its queue; its clients
        are rebuilt there on their next message from their last shipped-back snapshots."""
        old = self.workers[k]
        if not old.isolated.conn.closed:
            old.isolated.kill()
        self.workers[k] = fresh = self._fork(k)
        fresh.queue = old.queue
        lost = [cid for cid in old.clients if cid in self.setups]
        if lost and not self.keep:  # nothing shipped back: the run stops at this failure
            log.warning("a worker process died; the state of its clients is lost")
        self.stale.update(lost)

    def close(self, wait: bool = True) -> None:
        """Stop every worker: ask it to end and wait for it (a few seconds at most), or with
        ``wait=False`` kill it at once."""
        for worker in self.workers:
            worker.isolated.close(wait)
