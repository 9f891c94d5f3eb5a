"""The in-process engine: clients are objects in this process, messages are method calls.

Checkpoints follow :mod:`fedkit_core.engines.checkpoint` like every engine's: the server
commits its snapshot after each round; each client writes its own snapshot after each
message that changed its state, so ``fedkit resume`` continues after any interruption and
ends with the same results as an uninterrupted run.
"""

from __future__ import annotations

import copy
import time

import torch

from fedkit_core.config import Config
from fedkit_core.engines.checkpoint import ClientCheckpoints, checkpoint_client
from fedkit_core.engines.client import ClientRuntime, SharedModel, build_model
from fedkit_core.engines.context import ClientContext, derive_seed
from fedkit_core.engines.driver import drive
from fedkit_core.engines.server import Observer, Server
from fedkit_core.engines.snapshot import client_snapshot, restore_client
from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.messages import Message
from fedkit_core.plugins import PluginSet
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir


class LocalTransport:
    """Delivers messages by calling each client's ``handle``; a raising client becomes a
    failed reply (``error`` set, the exception kept for in-process re-raising). With
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
            before = _state_before(client, message)
            try:
                replies[cid] = client.handle(message)
                if self.stores is not None:
                    checkpoint_client(client, message, self.stores[cid])
            except Exception as err:  # recorded; the server decides whether the round survives
                if before is not None:  # as a Flower node keeps its context's last state
                    restore_client(client, before)
                text = str(err) if isinstance(err, FedkitError) else f"{type(err).__name__}: {err}"
                replies[cid] = Message(message.kind, error=text, exception=err)
            phase = str(message.scalars.get("query", message.kind))
            self.observer.on_phase(int(message.scalars.get("round", 0)), phase, done, len(messages))
        return replies


def _state_before(client: ClientRuntime, message: Message) -> dict | None:
    """A copy of ``client``'s snapshot before a message that changes its state, when the run
    tolerates failed clients (``min_clients``): a client failing mid-round is brought back
    to it rather than keeping half-trained state, as on a Flower node (whose failed message
    leaves its context unchanged), so that every engine and a resumed run agree."""
    if message.kind not in ("fit", "query") or client.ctx.config["min_clients"] is None:
        return None
    dirty = client.dirty
    snapshot = copy.deepcopy(client_snapshot(client))
    client.dirty = dirty  # taking the snapshot is no checkpoint
    return snapshot


class LocalEngine:
    """The in-process engine (``engine=local``); it has no options of its own."""

    options = ()

    def execute(
        self,
        cfg: Config,
        plugins: PluginSet,
        run_dir: RunDir | None,
        observer: Observer,
        resume: bool,
    ) -> Results:
        started = time.perf_counter()
        fed = prepare(cfg, plugins)
        server = Server(cfg, plugins, fed.task, fed.device, observer)
        model = shared_model(server, plugins)
        clients = {
            cid: ClientRuntime(cid, data, fed.task, cfg, plugins, fed.device, model)
            for cid, data in fed.clients.items()
        }
        stores = None
        if run_dir is not None and cfg["checkpoint"]:
            stores = {cid: ClientCheckpoints.of(run_dir.checkpoint, cid) for cid in clients}
        transport = LocalTransport(clients, observer, stores)
        return drive(server, transport, clients, plugins, run_dir, resume=resume, started=started)


def shared_model(server: Server, plugins: PluginSet) -> SharedModel | None:
    """One model for every client, when nothing of a client's model outlives a message.

    Without method plugins and without kept optimiser state, every message that uses a
    client's model first loads the whole model state from the server (fit and evaluate
    load the global state; nothing is private), so a model per client only costs memory
    and set-up time (a thousand clients: a thousand models). The clients then take turns
    with one model, built once: the results are the same (the per-client seeding of
    training does not depend on it), and they are evaluated together (see
    :class:`~fedkit_core.engines.client.SharedModel`). With plugins (private entries, extra modules,
    per-client state holding parameters) each client keeps its own.
    """
    if plugins.active or server.config["keep_optimizer_state"]:
        return None
    torch.manual_seed(derive_seed(server.config["seed"], "model", "clients"))
    model = build_model(plugins, ClientContext(server.task, server.config, server.ctx.device))
    if model.private_state():
        return None
    return SharedModel(model.to(server.ctx.device))


ENGINE = LocalEngine()
