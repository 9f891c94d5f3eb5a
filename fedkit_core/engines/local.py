"""The local engine: clients are objects in this process, messages are method calls; or,
with ``local.workers`` or ``client_timeout``, in forked worker processes
(:mod:`fedkit_core.engines.workers`). With ``pooled=true`` it runs the centralised
reference instead (:mod:`fedkit_core.engines.pooled`, in this process).

Checkpoints follow :mod:`fedkit_core.engines.checkpoint` like every engine's: the server
commits its snapshot after each round; each client writes its own snapshot after each
message that changed its state, so ``fedkit resume`` continues after any interruption and
ends with the same results as an uninterrupted run.
"""

from __future__ import annotations

import logging
import time

import torch

from fedkit_core.config import Config
from fedkit_core.contract.observer import Observer
from fedkit_core.contract.options import Option
from fedkit_core.devices import place_model
from fedkit_core.engines.checkpoint import ClientCheckpoints
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.driver import drive
from fedkit_core.engines.estimate import round_seconds, step_seconds
from fedkit_core.engines.model import build_model
from fedkit_core.engines.pool import ModelPool
from fedkit_core.engines.selection import round_half_up
from fedkit_core.engines.server import Server
from fedkit_core.engines.shared import SharedModel
from fedkit_core.engines.workers import (
    LocalTransport,
    WorkerTransport,
    auto_workers,
    cpu_cores,
    parse_workers,
)
from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.hooks.context import ClientContext, derive_seed
from fedkit_core.plugin_manager import PluginSet, installed
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir

log = logging.getLogger("fedkit")


class LocalEngine:
    """The in-process engine (``engine=local``): clients in this process, or in worker
    processes (``local.workers``; always with ``client_timeout``, which needs a process it
    can kill)."""

    options = (
        Option(
            "workers",
            str,
            "auto",
            "worker processes the clients run in: 0 (in this process, one after the other), "
            "a count, or auto (as many as the cores hold at local.threads each when that is "
            "2 or more, on a CPU of 4 or more cores, without run(plugins=...) objects; else "
            "0); client_timeout needs at least 1",
        ),
        Option(
            "threads",
            int,
            None,
            "torch intra-op threads of each worker process (default: this process's). torch "
            "kernels may sum in an order that depends on it: with the default, workers give "
            "the in-process results bit for bit",
            min=1,
        ),
        Option(
            "live_models",
            int,
            None,
            "with method plugins (clients that keep models of their own): build a client's "
            "model when a message first needs it and keep at most this many models live per "
            "process, the other clients idle as their checkpoint state (a thousand clients "
            "are then not a thousand models; a client that is used again rebuilds its model "
            "and restores that state, bit for bit). Default: every client builds its model "
            "at set-up and keeps it. Plugins must keep copies, not the model's tensors, in "
            "ctx.state and ctx.scratch (see docs/engines.md)",
            min=1,
        ),
    )

    def execute(
        self,
        cfg: Config,
        plugins: PluginSet,
        run_dir: RunDir | None,
        observer: Observer,
        resume: bool,
    ) -> Results:
        if cfg["pooled"]:  # the centralised reference, in this process
            from fedkit_core.engines.pooled import execute_pooled

            return execute_pooled(cfg, plugins, run_dir, observer, resume)
        started = time.perf_counter()
        setting = parse_workers(cfg["local.workers"])
        fed = prepare(cfg, plugins)
        count = _worker_count(cfg, setting, plugins, len(fed.clients), fed.device)
        server = Server(cfg, plugins, fed.task, fed.device, observer)
        model = shared_model(server, plugins)
        live = cfg["local.live_models"]
        models = ModelPool(live) if live is not None and model is None else None
        clients = {
            cid: ClientRuntime(
                cid, fed.client_data(cid), fed.task, cfg, plugins, fed.device, model, models
            )
            for cid in fed.clients
        }
        if getattr(observer, "wants_estimate", False) and not resume:  # the cost, before round 1
            step = step_seconds(server)
            observer.on_estimate(round_seconds(server, fed.infos, step), cfg["rounds"])
        stores = None
        if run_dir is not None and cfg["checkpoint"]:
            stores = {cid: ClientCheckpoints.of(run_dir.checkpoint, cid) for cid in clients}
        if count == 0:
            transport = LocalTransport(clients, observer, stores)
            return drive(
                server, transport, clients, plugins, run_dir, resume=resume, started=started
            )
        log.info("local engine: clients in %d worker processes", count)
        threads = cfg["local.threads"] or torch.get_num_threads()
        pool = WorkerTransport(clients, observer, stores, cfg, count, threads)
        try:
            results = drive(server, pool, clients, plugins, run_dir, resume=resume, started=started)
        except BaseException:  # Ctrl-C or a failed run: no message in flight is worth waiting for
            pool.close(wait=False)
            raise
        pool.close()
        return results


def _worker_count(
    cfg: Config, setting: int | None, plugins: PluginSet, clients: int, device: torch.device
) -> int:
    """The worker processes of a run: ``local.workers`` (``auto``: :func:`auto_workers`),
    at least one with ``client_timeout``, never more than clients."""
    if setting is None:
        sampled = min(clients, max(1, round_half_up(cfg["sample_fraction"] * clients)))
        threads = cfg["local.threads"] or torch.get_num_threads()
        objects = bool(set(plugins.active) - set(installed()))
        setting = auto_workers(sampled, cpu_cores(), threads, device, objects)
    if cfg["client_timeout"] is not None:
        setting = max(setting, 1)
    if setting and device.type != "cpu":
        raise FedkitError(
            f"clients in worker processes (local.workers, client_timeout) need device=cpu: "
            f"CUDA cannot be used in forked processes (device is {device})"
        )
    return min(setting, clients)


def shared_model(server: Server, plugins: PluginSet) -> SharedModel | None:
    """One model for every client, when nothing of a client's model outlives a message.

    Without method plugins and without kept optimiser state, every message that uses a
    client's model first loads the whole model state from the server (fit and evaluate
    load the global state; nothing is private), so a model per client only costs memory
    and set-up time (a thousand clients: a thousand models). The clients then take turns
    with one model, built once: the results are the same (the per-client seeding of
    training does not depend on it), and they are evaluated together (see
    :class:`~fedkit_core.engines.shared.SharedModel`). With plugins (private entries, extra modules,
    per-client state holding parameters) each client keeps its own.
    """
    if plugins.active or server.config["keep_optimizer_state"]:
        return None
    torch.manual_seed(derive_seed(server.config["seed"], "model", "clients"))
    model = build_model(plugins, ClientContext(server.task, server.config, server.ctx.device))
    if model.private_state():
        return None
    return SharedModel(place_model(model, server.ctx.device, server.config["channels_last"]))


ENGINE = LocalEngine()
