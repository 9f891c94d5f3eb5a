"""The client side on Flower: a ClientApp serving one fedkit client per SuperNode.

Flower may run each message of a node in a different process (one Ray worker or one
``flwr-clientapp`` process per message), so nothing may live only in process memory. What a
client must keep between messages is saved in the node's Flower ``Context.state``:

* ``fedkit.setup`` / ``fedkit.priors``: the task description and server priors of the setup
  message, to rebuild the client (model, client priors) in a fresh process;
* ``fedkit.state``: the client's snapshot (:mod:`fedkit_core.engines.snapshot`: its
  persistent state plus what must survive from a ``fit`` to the ``query`` messages of the
  same round), with a version number.

With checkpoints on, the node also writes each snapshot to its client's own checkpoint
folder (:mod:`fedkit_core.engines.checkpoint`) and restores it from there when the server's
setup message resumes a run.

A process keeps the clients it built in memory and reloads a client's state only when the
context holds a newer version, so a worker that serves a node repeatedly pays nothing.

A client that must be stoppable (``client_timeout`` set) answers in an isolated worker
(:class:`~fedkit_core.engines.isolation.Isolated`, a forked child of the ClientApp's
process kept from one message to the next), in a simulation and on a deployed node alike:
a client that misses ``client_timeout`` is killed, one whose process exits is noticed at
once, and either way the node replies "failed" with its context as before the message and
the next message gets a new worker. A warm SuperNode (the fast layer, :mod:`.warm`) always
answers in such a worker, which keeps its long-lived executor safe. A deployed server sends
each message's content packed in one Flower record (:mod:`.packing`); the node answers a
packed message packed.

The ClientApp may be pickled with every message (Flower's Ray backend does): its
:class:`ClientSide` travels as its :class:`Source` and a token of the run, and a process
unpickles it into the one :class:`ClientSide` it keeps for that token, so a Ray worker
loads its nodes' data once per run.

Which client a node serves: its node config's ``partition-id`` indexes the clients that
fedkit's partition of the node's data yields (every node of a simulation, or nodes holding a
copy of the whole data); a node whose data yields a single client (a site holding only its
own data, ``data-path=...``) serves that client.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp

from fedkit_core.config import Config
from fedkit_core.contract.data import TaskInfo
from fedkit_core.contract.messages import Arrays, Message
from fedkit_core.engines.checkpoint import ClientCheckpoints, checkpoint_client
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.flower.packing import PACKED, pack, unpack
from fedkit_core.engines.flower.records import (
    from_array_record,
    from_records,
    kind_of,
    to_array_record,
    to_records,
)
from fedkit_core.engines.flower.secure import client_mod
from fedkit_core.engines.isolation import Isolated, Stopped
from fedkit_core.engines.snapshot import from_bytes, restore_client, to_bytes
from fedkit_core.errors import FedkitError, failure_text, no_space
from fedkit_core.federation import Federation, prepare
from fedkit_core.resolve import resolve_config

#: run config keys of a deployed run (see deploy.py)
CONFIG_KEY, OUT_KEY = "fedkit-config", "out"
#: node config keys of a SuperNode
PARTITION_KEY, DATA_PATH_KEY = "partition-id", "data-path"
#: the scalar of the setup message that carries the server's task description
TASK_KEY = "fedkit.task"
SETUP, PRIORS, STATE = "fedkit.setup", "fedkit.priors", "fedkit.state"
#: whether every message answers in an isolated worker, ``client_timeout`` or not: set by
#: a warm SuperNode's long-lived executor (:mod:`.warm`), which a client must not take down
ALWAYS_ISOLATED = False


@dataclass
class Source:
    """Where the ClientApp takes the run's config and plugins from.

    ``config`` (a nested fedkit config) and ``plugins`` (plugin objects registered at run
    time) are given in a simulation; a deployed ClientApp reads the config from the run
    config (``fedkit-config``, JSON) and uses installed plugins only. ``federation`` lets an
    in-process simulation share the data the driver already loaded. ``checkpoints``: the
    folder holding each client's checkpoint folder (None: no client checkpoints).
    ``threads``: torch's intra-op threads in a process that unpickles the ClientApp (a Ray
    worker), so that its clients compute as this process's do.
    """

    config: dict[str, Any] | None = None
    plugins: dict[str, Any] | None = None
    federation: Federation | None = None
    checkpoints: str | None = None
    threads: int | None = None

    def config_for(self, context: Context) -> dict[str, Any]:
        config = self.config
        if config is None:
            raw = context.run_config.get(CONFIG_KEY)
            if not raw:
                raise FedkitError(
                    f"the Flower run has no {CONFIG_KEY!r} in its run config; submit fedkit "
                    "runs with `fedkit flower submit`"
                )
            config = json.loads(str(raw))
        path = context.node_config.get(DATA_PATH_KEY)
        if path:  # this node's own copy of the data
            config = copy.deepcopy(config)
            config.setdefault("task", {})["path"] = str(path)
        return config


def to_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=lambda v: v.tolist())


class NodeClient:
    """One node's fedkit client as held by this process."""

    def __init__(self, federation: Federation, index: int, checkpoints: str | None = None):
        ids = list(federation.clients)
        if len(ids) > 1 and not 0 <= index < len(ids):
            raise FedkitError(
                f"this SuperNode has {PARTITION_KEY}={index}, but the data yields {len(ids)} "
                f"clients ({', '.join(ids)}); use a {PARTITION_KEY} from 0 to {len(ids) - 1}"
            )
        self.federation = federation
        self.index = index
        self.id = ids[0] if len(ids) == 1 else ids[index]
        self.runtime: ClientRuntime | None = None
        self.version = -1
        self.store = ClientCheckpoints.of(Path(checkpoints), self.id) if checkpoints else None

    def describe(self) -> Message:
        """Who this client is and what task its data holds (classes, channels, image shape),
        so the server can build the task description; none of the client's statistics."""
        task = self.federation.task.to_dict()
        task.pop("client_ids")
        return Message(
            "describe",
            scalars={"client_id": self.id, "index": self.index, "task": to_json(task)},
        )

    def setup(self, message: Message, context: Context) -> Message:
        """Build the client for the server's task description and priors; keep both. A
        resuming setup restores the client from its checkpoint."""
        task = str(message.scalars.get(TASK_KEY, ""))
        if not task:
            raise FedkitError("the setup message lacks the server's task description")
        context.state[SETUP] = ConfigRecord({"task": task})
        context.state[PRIORS] = to_array_record(message.arrays)
        context.state[STATE] = ConfigRecord({"version": 0})
        self.runtime, reply = self._build(task, message.arrays)
        self.version = 0
        restored = checkpoint_client(self.runtime, message, self.store)
        if restored is not None:
            self.save(context, restored)
        return reply

    def _build(self, task: str, priors: Arrays) -> tuple[ClientRuntime, Message]:
        """The client and its setup reply."""
        fed = self.federation
        runtime = ClientRuntime(
            self.id,
            fed.client_data(self.id),
            TaskInfo.from_dict(json.loads(task)),
            fed.config,
            fed.plugins,
            fed.device,
        )
        return runtime, runtime.setup(Message("setup", priors))

    def current(self, context: Context) -> ClientRuntime:
        """The client, rebuilt and brought to the context's latest state if needed."""
        if SETUP not in context.state or STATE not in context.state:
            raise FedkitError("this SuperNode received a message before fedkit's setup message")
        if self.runtime is None:
            priors = from_array_record(context.state.array_records[PRIORS])
            task = str(context.state.config_records[SETUP]["task"])
            self.runtime, _ = self._build(task, priors)
            self.version = 0
        stored = context.state.config_records[STATE]
        if int(stored["version"]) != self.version:
            restore_client(self.runtime, from_bytes(bytes(stored["blob"]), "the node's state"))
            self.version = int(stored["version"])
        return self.runtime

    def save(self, context: Context, snapshot: dict[str, Any]) -> None:
        """Keep ``snapshot`` in the node's context, for the next message's process."""
        self.version += 1
        context.state[STATE] = ConfigRecord({"version": self.version, "blob": to_bytes(snapshot)})


class ClientSide:
    """Handles every fedkit message a node receives (the body of the ClientApp)."""

    def __init__(self, source: Source, token: str | None = None):
        self.source = source
        self.token = token or uuid.uuid4().hex
        self.lock = threading.Lock()
        self.federation_key: str | None = None
        self.federation: Federation | None = None
        self.clients: dict[tuple[int, int], NodeClient] = {}
        self.worker: Isolated | None = None  # where a stoppable client answers

    def __reduce__(self) -> tuple[Any, ...]:  # pickled: the source and the run's token
        return _side_for, (self.token, Source(**{**self.source.__dict__, "federation": None}))

    def __call__(self, message: FlowerMessage, context: Context) -> FlowerMessage:
        timeout = self.source.config_for(context).get("client_timeout")
        if hasattr(os, "fork") and (timeout is not None or ALWAYS_ISOLATED):
            return self._isolated(message, context, timeout)
        return self._answer(message, context)

    def _isolated(
        self, message: FlowerMessage, context: Context, timeout: float | None
    ) -> FlowerMessage:
        """Answer ``message`` in this process's :class:`Isolated` worker, so that a client
        that hangs past ``client_timeout`` (killed) or whose process exits gets a failed
        reply at once, and the node's context keeps the state from before the message; the
        message after such a failure starts a new worker."""
        if self.worker is None:
            try:  # the node's data and client, inherited by the worker
                with self.lock:
                    client = self.client(context)
                    if SETUP in context.state:
                        client.current(context)  # built once, then brought to the context's state
            except Exception:  # noqa: BLE001 - the worker meets it again and replies with it
                pass
            self.worker = Isolated(self._answer_request, name="fedkit-client")
        request = (message.metadata.message_type, message.content, context)
        try:
            content, state = self.worker.ask(request, timeout)
        except Stopped as stopped:
            self.worker = None
            failed = Message(kind_of(message.metadata.message_type), error=str(stopped))
            return FlowerMessage(to_records(failed), reply_to=message)
        context.state = state
        return FlowerMessage(content, reply_to=message)

    def close(self) -> None:
        """End this process's isolated worker, if any (the run is over)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def _answer_request(self, request: tuple[str, RecordDict, Context]) -> tuple[Any, Any]:
        """In the isolated worker: the reply content and the context state after it."""
        message_type, content, context = request
        return self._answer_content(message_type, content, context), context.state

    def _answer(self, message: FlowerMessage, context: Context) -> FlowerMessage:
        content = self._answer_content(message.metadata.message_type, message.content, context)
        return FlowerMessage(content, reply_to=message)

    def _answer_content(
        self, message_type: str, content: RecordDict, context: Context
    ) -> RecordDict:
        """The content of the reply to a message of ``message_type`` and ``content``."""
        kind = "query"
        packed = PACKED in content.config_records  # a deployed server packs arrays
        try:
            kind = kind_of(message_type)
            with self.lock:
                reply = self.handle(kind, from_records(unpack(content), kind), context)
        except (Exception, SystemExit) as err:  # reported; the server decides if the run goes on
            err = no_space(err)
            reply = Message(kind, error=failure_text(err), exception=err)
            self.clients.pop((context.run_id, context.node_id), None)  # rebuilt from the context
        records = to_records(reply)
        return pack(records) if packed else records

    def handle(self, kind: str, message: Message, context: Context) -> Message:
        client = self.client(context)
        if kind == "describe":
            return client.describe()
        if kind == "setup":
            return client.setup(message, context)
        runtime = client.current(context)
        reply = runtime.handle(message)
        snapshot = checkpoint_client(runtime, message, client.store)
        if snapshot is not None:
            client.save(context, snapshot)
        return reply

    def secure_fit(self, message: Message, context: Context) -> Message:
        """A fit message inside SecAgg+'s masking stage (see :mod:`fedkit_core.engines.flower.secure`)."""
        with self.lock:
            return self.handle("fit", message, context)

    def config_of(self, context: Context) -> Config:
        """The resolved config of ``context``'s run."""
        return self.client(context).federation.config

    def client(self, context: Context) -> NodeClient:
        """This node's client, loading the node's data once per process and config."""
        config = self.source.config_for(context)
        key = to_json(config)
        if key != self.federation_key:
            self.federation = self.source.federation
            if self.federation is None or to_json(self.federation.config.nested()) != key:
                self.federation = prepare(*resolve_config(config, self.source.plugins))
            self.federation_key = key
            self.clients.clear()
        assert self.federation is not None
        node = (context.run_id, context.node_id)
        if node not in self.clients:
            index = int(context.node_config.get(PARTITION_KEY, 0))
            self.clients[node] = NodeClient(self.federation, index, self.source.checkpoints)
        return self.clients[node]


_SIDE: ClientSide | None = None  # this process's ClientSide of the current run


def _side_for(token: str, source: Source) -> ClientSide:
    """The :class:`ClientSide` of run ``token`` in this process (an unpickled ClientApp's):
    one per run, so its data and clients are built once, not for every message."""
    global _SIDE
    if _SIDE is None or _SIDE.token != token:
        if source.threads:  # the run's torch threads, not those Ray's environment implies
            torch.set_num_threads(source.threads)
        _SIDE = ClientSide(source, token)
    return _SIDE


def make_client_app(source: Source | None = None) -> ClientApp:
    """A Flower ClientApp that answers fedkit's messages (see :class:`ClientSide`)."""
    app = ClientApp()
    side = ClientSide(source or Source())
    app.fedkit_side = side  # type: ignore[attr-defined]
    app.query("fedkit_describe")(side)
    app.query("fedkit_setup")(side)
    app.query()(side)
    # secure aggregation: Flower's SecAgg+ mod around the fit (other messages pass it by)
    app.train(mods=[client_mod(side.secure_fit, side.config_of)])(side)
    app.evaluate()(side)
    return app
