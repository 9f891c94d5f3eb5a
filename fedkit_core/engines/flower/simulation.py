"""``fedkit run --engine flower``: the run as a ServerApp + ClientApp in Flower's simulation
runtime (one virtual SuperNode per client).

Two backends execute the ClientApps:

* ``ray`` (default): Flower's own, a pool of Ray worker processes (``flower.client_cpus``
  CPUs each). Plugins must be importable by the workers (installed plugins; plugin objects
  passed to :func:`fedkit_core.run` are pickled by reference to their module).
* ``thread``: the ClientApps run one message at a time in a thread of this process, inside
  the same Flower simulation runtime (SuperLink state, grid, node contexts, message queues);
  it starts at once and needs no Ray. Flower 1.41 hard-wires Ray as the runtime's backend,
  so this backend is put in its place while the run lasts (see :func:`_backend`).

Both enforce ``client_timeout`` per client message where the client runs (the server cannot:
the thread backend serves clients one after another). A client that misses it gets a failed
reply, and its node context keeps the state from before the message (so a retry, with
``client_retries``, starts from there): the thread backend abandons the message's thread (a
daemon: it cannot keep the process alive) and a Ray worker is killed and replaced. A Ray
worker whose process exits is replaced too, so only the client it was serving fails.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import threading
import types
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from flwr.app import Context
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException
from flwr.server.superlink.fleet.vce.backend import Backend
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedkit_core.config import Config
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.flower.node import Source, make_client_app
from fedkit_core.engines.flower.serverapp import serve
from fedkit_core.engines.workers import cpu_cores
from fedkit_core.errors import FedkitError, failure_text
from fedkit_core.federation import prepare
from fedkit_core.plugins import PluginSet
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir

RAY_BACKEND_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"


def simulate(
    cfg: Config,
    plugin_set: PluginSet,
    run_dir: RunDir | None,
    observer: Observer,
    *,
    resume: bool = False,
) -> Results:
    """Run ``cfg`` in Flower's simulation runtime and return its results; with ``resume``,
    continue the run in ``run_dir`` from its checkpoint. Each virtual SuperNode keeps its
    client's checkpoints under the run's ``checkpoint`` folder."""
    opts = cfg.section("flower")
    federation = prepare(cfg, plugin_set)  # the number of clients = virtual SuperNodes
    nodes = len(federation.clients)
    if opts["nodes"] not in (None, nodes):
        raise FedkitError(
            f"flower.nodes={opts['nodes']} but the task has {nodes} clients; a simulation "
            "starts one SuperNode per client (drop flower.nodes)"
        )
    extra = {name: plugin_set.objects[name] for name in plugin_set.active}
    in_process = opts["backend"] == "thread"
    checkpoints = str(run_dir.checkpoint) if run_dir is not None and cfg["checkpoint"] else None
    shared = federation if in_process else None
    source = Source(cfg.nested(), extra or None, shared, checkpoints)
    outcome: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        outcome["results"] = serve(grid, cfg, plugin_set, run_dir, observer, nodes, resume=resume)

    cpus = client_cpus(opts["client_cpus"])
    backend_config = {
        "client_resources": {"num_cpus": cpus, "num_gpus": opts["client_gpus"]},
        # a Ray instance of its own: not a cluster that $RAY_ADDRESS names (Ray retries an
        # unreachable one forever) nor one this machine happens to run; with the cores this
        # process may use (Ray would count the machine's)
        "init_args": {"address": "local", "num_cpus": cpu_cores()},
        FEDKIT_KEY: {"client_timeout": cfg["client_timeout"], "threads": max(1, int(cpus))},
    }
    with _backend(opts["backend"]) as name, _quiet_flower():
        try:
            run_simulation(
                server_app,
                make_client_app(source),
                num_supernodes=nodes,
                backend_name=name,
                backend_config=backend_config,
            )
        except RuntimeError as err:  # the runtime wraps the ServerApp's exception
            cause = err.__cause__
            raise (cause if isinstance(cause, FedkitError) else err) from None
    if "results" not in outcome:
        raise FedkitError("the Flower simulation ended without results (see the log above)")
    return outcome["results"]


FEDKIT_KEY = "fedkit"  # fedkit's part of the backend config


def client_cpus(setting: float | None) -> float:
    """The CPUs a Ray worker reserves, and (whole) its torch threads: ``flower.client_cpus``,
    by default this process's torch threads, at most the cores it may use.

    The thread count changes the last bits of a CPU kernel's sums (see "the intra-op thread
    count" in docs/engines.md): a Ray worker running at 1 thread gave other numbers than
    the local engine at this process's 2 (``fedkit run --plugin fca --rounds 3 --seed 5``:
    final bACC 0.4220 against 0.4151). At the same count the results are the local
    engine's, and the workers in parallel hold the cores as the local engine's ``auto``
    workers do."""
    if setting is not None:
        return setting
    return float(min(torch.get_num_threads(), cpu_cores()))


def _timeout_of(backend_config: dict[str, Any]) -> float | None:
    return backend_config.get(FEDKIT_KEY, {}).get("client_timeout")


def _missed(timeout: float | None) -> ClientAppException:
    return ClientAppException(f"no reply within {timeout:g} s (client_timeout)")


class ThreadBackend(Backend):
    """Runs each ClientApp call in a thread of this process, one message at a time.

    One at a time keeps runs deterministic: clients seed torch's global generator before
    building their model, which concurrent threads would interleave. Each call gets a
    daemon thread of its own when ``client_timeout`` is set (else it runs in the calling
    thread) and a copy of the node context, so a call that misses ``client_timeout`` is
    abandoned without touching the context or keeping the process alive; a client that
    calls ``sys.exit`` fails like one that raises.
    """

    def __init__(self, backend_config: dict[str, Any]) -> None:
        super().__init__(backend_config)
        self.app_fn: Callable[[], ClientApp] | None = None
        self.timeout = _timeout_of(backend_config)

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return 1

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        self.app_fn = None

    def process_message(
        self, message: FlowerMessage, context: Context
    ) -> tuple[FlowerMessage, Context]:
        if self.app_fn is None:
            raise RuntimeError("ThreadBackend.build() was not called")
        app = self.app_fn()
        work = copy.deepcopy(context)
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["reply"] = app(message=message, context=work)
            except BaseException as err:  # noqa: BLE001 - SystemExit too: the client exited
                outcome["error"] = err

        if self.timeout is None:  # nothing to abandon: no thread of its own
            call()
        else:
            thread = threading.Thread(target=call, name="fedkit-client", daemon=True)
            thread.start()
            thread.join(self.timeout)
        if "reply" not in outcome and "error" not in outcome:  # still running: abandoned
            side = getattr(app, "fedkit_side", None)
            if side is not None:
                side.abandon(context)
            raise _missed(self.timeout)
        if "error" in outcome:  # what Flower's Ray workers raise, so the runtime replies
            err = outcome["error"]
            raise ClientAppException(failure_text(err)) from err
        return outcome["reply"], work


def fedkit_ray_backend() -> type[Backend]:
    """Flower's Ray backend with a per-client timeout and workers that fail alone.

    Flower 1.41's own waits for a worker without limit and puts a worker whose process died
    back into its pool, where it fails every later message it is given. Here a worker that
    misses ``client_timeout`` is killed, and a missing or dead worker is replaced by a fresh
    one; only the message it was serving fails.
    """
    import ray
    from flwr.common.constant import PARTITION_ID_KEY
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    class FedkitRayBackend(RayBackend):
        def __init__(self, backend_config: dict[str, Any]) -> None:
            self.timeout = _timeout_of(backend_config)
            self.threads = backend_config.get(FEDKIT_KEY, {}).get("threads")
            super().__init__({k: v for k, v in backend_config.items() if k != FEDKIT_KEY})

        def build(self, app_fn: Callable[[], ClientApp]) -> None:
            super().build(WorkerApp(app_fn, self.threads))
            assert self.pool is not None
            self._warm(list(self.pool.pool))

        def _warm(self, actors: list[Any]) -> None:
            """Have ``actors`` load the ClientApp (imports) before they serve a message,
            so that ``client_timeout`` counts the client's work, not a worker's start."""
            calls = [a.run.remote(self.app_fn, None, "warm-up", None) for a in actors]
            for call in calls:
                with contextlib.suppress(Exception):  # the app has no message: it raises
                    ray.get(call)

        def _replace(self, actor: Any) -> None:
            """A fresh (warm) worker in place of ``actor``, which hung or died."""
            assert self.pool is not None
            ray.kill(actor)
            fresh = self.pool.create_actor_fn()
            self._warm([fresh])
            self.pool.pool.append(fresh)

        def process_message(
            self, message: FlowerMessage, context: Context
        ) -> tuple[FlowerMessage, Context]:
            if self.pool is None or self.app_fn is None:
                raise RuntimeError("FedkitRayBackend.build() was not called")
            pool = self.pool
            actor = pool.pool.pop()  # one worker thread per actor: never empty here
            partition = str(context.node_config[PARTITION_ID_KEY])
            future = actor.run.remote(self.app_fn, message, partition, context)
            try:
                _, reply, updated = ray.get(future, timeout=self.timeout)
            except ray.exceptions.GetTimeoutError:
                self._replace(actor)
                raise _missed(self.timeout) from None
            except ray.exceptions.RayActorError as err:
                self._replace(actor)
                raise ClientAppException(f"the client's process exited ({err})") from None
            except Exception:
                pool.pool.append(actor)
                raise
            pool.pool.append(actor)
            return reply, updated

    return FedkitRayBackend


_WORKER_APP: tuple[str, ClientApp] | None = None  # a Ray worker's ClientApp, by its token


class WorkerApp:
    """The ``app_fn`` handed to Ray workers: the ClientApp is unpickled once per worker.

    Ray pickles a task's arguments with every call, and Flower passes ``app_fn`` with every
    message: the ClientApp, and with it fedkit's client side (the node's data and clients),
    would be rebuilt for every message. This carries the pickled ClientApp as bytes and a
    token for the run; a worker unpickles it at its first message and keeps it.
    """

    def __init__(self, app_fn: Callable[[], ClientApp], threads: int | None = None) -> None:
        from ray import cloudpickle

        self.token = uuid.uuid4().hex
        self.blob = cloudpickle.dumps(app_fn)
        self.threads = threads

    def __call__(self) -> ClientApp:
        global _WORKER_APP
        if _WORKER_APP is None or _WORKER_APP[0] != self.token:
            from ray import cloudpickle

            if self.threads:  # the torch threads of the run, not those Ray's env implies
                torch.set_num_threads(self.threads)
            _WORKER_APP = (self.token, cloudpickle.loads(self.blob)())
        return _WORKER_APP[1]


@contextmanager
def _backend(name: str) -> Iterator[str]:
    """The backend name to pass to ``run_simulation``, with fedkit's backend installed.

    Flower 1.41's simulation runtime always imports ``RayBackend`` from
    :data:`RAY_BACKEND_MODULE` when it starts; that module is replaced until the run ends
    by one whose ``RayBackend`` is :class:`ThreadBackend` (``thread``) or
    :func:`fedkit_ray_backend` (``ray``).
    """
    if name == "ray":
        try:
            backend = fedkit_ray_backend()
        except ImportError:
            raise FedkitError(
                "flower.backend=ray needs Ray: pip install 'fedkit[flower]' "
                "(or set flower.backend=thread)"
            ) from None
    else:
        backend = ThreadBackend
    stand_in = types.ModuleType(RAY_BACKEND_MODULE)
    stand_in.RayBackend = backend  # type: ignore[attr-defined]
    saved = sys.modules.get(RAY_BACKEND_MODULE)
    sys.modules[RAY_BACKEND_MODULE] = stand_in
    try:
        yield "ray" if name == "ray" else "thread"
    finally:
        if saved is None:
            sys.modules.pop(RAY_BACKEND_MODULE, None)
        else:
            sys.modules[RAY_BACKEND_MODULE] = saved


def _not_a_client_traceback(record: logging.LogRecord) -> bool:
    """False for Flower's log of a failed ClientApp (its exception and traceback): fedkit
    records and shows that failure as the round's event; ``--debug`` keeps them."""
    text = str(record.msg)
    return not (
        text.startswith("Traceback (most recent call last)")
        or "ClientAppException occurred" in text
    )


@contextmanager
def _quiet_flower() -> Iterator[None]:
    """Keep Flower's INFO logs, its tracebacks of failed clients (unless ``--debug``), the
    run_simulation deprecation notice and Ray's tip about a future default off the console."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.ERROR)
    debug = os.environ.get("FEDKIT_DEBUG") == "1"
    if not debug:
        logger.addFilter(_not_a_client_traceback)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
            yield
    finally:
        logger.setLevel(level)
        logger.removeFilter(_not_a_client_traceback)
