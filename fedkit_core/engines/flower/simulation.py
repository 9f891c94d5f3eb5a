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
"""

from __future__ import annotations

import logging
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.app import Context
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException
from flwr.server.superlink.fleet.vce.backend import Backend
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedkit_core.config import Config
from fedkit_core.engines.flower.node import Source, make_client_app
from fedkit_core.engines.flower.serverapp import serve
from fedkit_core.engines.server import Observer
from fedkit_core.errors import FedkitError
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

    backend_config = {
        "client_resources": {"num_cpus": opts["client_cpus"], "num_gpus": opts["client_gpus"]}
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


class ThreadBackend(Backend):
    """Runs each ClientApp call in the runtime's worker thread, one message at a time.

    One at a time keeps runs deterministic: clients seed torch's global generator before
    building their model, which concurrent threads would interleave.
    """

    def __init__(self, backend_config: dict[str, Any]) -> None:
        super().__init__(backend_config)
        self.app_fn: Callable[[], ClientApp] | None = None

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
        try:
            return self.app_fn()(message=message, context=context), context
        except Exception as err:  # what Flower's Ray workers raise, so the runtime replies
            raise ClientAppException(str(err)) from err


@contextmanager
def _backend(name: str) -> Iterator[str]:
    """The backend name to pass to ``run_simulation``, with the thread backend installed.

    Flower 1.41's simulation runtime always imports ``RayBackend`` from
    :data:`RAY_BACKEND_MODULE` when it starts; for ``thread``, that module is replaced by
    one whose ``RayBackend`` is :class:`ThreadBackend` until the run ends.
    """
    if name == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise FedkitError(
                "flower.backend=ray needs Ray: pip install 'fedkit[flower]' "
                "(or set flower.backend=thread)"
            ) from None
        yield "ray"
        return
    stand_in = types.ModuleType(RAY_BACKEND_MODULE)
    stand_in.RayBackend = ThreadBackend  # type: ignore[attr-defined]
    saved = sys.modules.get(RAY_BACKEND_MODULE)
    sys.modules[RAY_BACKEND_MODULE] = stand_in
    try:
        yield "thread"
    finally:
        if saved is None:
            sys.modules.pop(RAY_BACKEND_MODULE, None)
        else:
            sys.modules[RAY_BACKEND_MODULE] = saved


@contextmanager
def _quiet_flower() -> Iterator[None]:
    """Keep Flower's INFO logs, the run_simulation deprecation notice and Ray's tip about
    a future default off the console."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
            yield
    finally:
        logger.setLevel(level)
