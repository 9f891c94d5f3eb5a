"""``fedkit run --engine flower``: the run as a ServerApp + ClientApp in Flower's simulation
runtime (one virtual SuperNode per client), through ``flwr.simulation.run_simulation``.

Two backends execute the ClientApps:

* ``ray`` (default): Flower's own, unchanged: a pool of Ray worker processes
  (``flower.client_cpus`` CPUs each). Plugins must be importable by the workers (installed
  plugins; plugin objects passed to :func:`fedkit_core.run` are pickled by reference to
  their module). Each worker builds its node's data once per run (:mod:`.node`).
* ``thread``: the ClientApps run one message at a time in this process, inside the same
  Flower simulation runtime; it starts at once and needs no Ray. Flower's runtime
  hard-wires Ray, so this is part of the fast layer (:mod:`.fast`): on a Flower release it
  was not written for, the run falls back to ``ray`` with one warning.

The Ray instance is this run's own and reachable from this machine only: its node address
is the loopback interface, so the GCS, the raylet, the agents and the workers listen on
127.0.0.1 (on ports Ray picks at random) and the dashboard is off; and it admits only
processes that hold a random token made for the run (Ray's token authentication; the token
is in the environment of the run's processes only): whoever could join a Ray instance would
run code as the run's user. Its temporary folder (sockets, logs) lies in a fresh 0700
folder that nobody else may enter (Ray makes its own folders 0777), removed after the run
(kept, and named, under ``--debug``); with ``private`` the files there are 0600 too (umask
077 while Ray runs).

``client_timeout`` is enforced inside the ClientApp, on either backend: the fedkit client
then answers in an isolated worker process (:mod:`fedkit_core.engines.isolation`), killed
when it misses the timeout or noticed when it exits; the node replies "failed" and its
context keeps the state from before the message (so a retry, with ``client_retries``,
starts from there). No Flower backend is patched for it.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedkit_core.config import Config
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.flower.fast import fast_layer, thread_backend
from fedkit_core.engines.flower.node import Source, make_client_app
from fedkit_core.engines.flower.serverapp import serve
from fedkit_core.engines.workers import cpu_cores
from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir


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
    in_process = opts["backend"] == "thread" and fast_layer("flower.backend=thread")
    checkpoints = str(run_dir.checkpoint) if run_dir is not None and cfg["checkpoint"] else None
    shared = federation if in_process else None
    cpus = client_cpus(opts["client_cpus"])
    source = Source(cfg.nested(), extra or None, shared, checkpoints, max(1, int(cpus)))
    outcome: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        outcome["results"] = serve(grid, cfg, plugin_set, run_dir, observer, nodes, resume=resume)

    client_app = make_client_app(source)
    with _backend(in_process, bool(cfg["private"])) as (name, ray_args), _quiet_flower():
        backend_config = {
            "client_resources": {"num_cpus": cpus, "num_gpus": opts["client_gpus"]},
            # a Ray instance of its own: not a cluster that $RAY_ADDRESS names (Ray retries
            # an unreachable one forever) nor one this machine happens to run; with the cores
            # this process may use (Ray would count the machine's); on loopback only
            "init_args": {"address": "local", "num_cpus": cpu_cores(), **ray_args},
        }
        try:
            run_simulation(
                server_app,
                client_app,
                num_supernodes=nodes,
                backend_name=name,
                backend_config=backend_config,
            )
        except RuntimeError as err:  # the runtime wraps the ServerApp's exception
            cause = err.__cause__
            raise (cause if isinstance(cause, FedkitError) else err) from None
        finally:
            client_app.fedkit_side.close()  # an isolated worker of the thread backend's
    if "results" not in outcome:
        raise FedkitError("the Flower simulation ended without results (see the log above)")
    return outcome["results"]


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


@contextmanager
def _backend(in_process: bool, private: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """The backend name to pass to ``run_simulation`` and the extra arguments of
    ``ray.init``: Flower's Ray backend on loopback (:func:`loopback_ray`), or with
    ``in_process`` the fast layer's thread backend, in place while the run lasts."""
    if in_process:
        with thread_backend() as name:
            yield name, {}
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise FedkitError(
            "flower.backend=ray needs Ray: pip install 'fedkit[flower]' "
            "(or set flower.backend=thread)"
        ) from None
    with loopback_ray(private) as ray_args:
        yield "ray", ray_args


#: Ray's switch (read by ``ray._private.services.get_node_ip_address``) that makes a local
#: instance's node address the loopback one; Ray sets it so on macOS and Windows
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


#: Ray's token authentication (Ray >= 2.52): the mode and the token every process of the
#: instance must present
RAY_TOKEN_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def _ray_has_tokens() -> bool:
    import ray._raylet

    return hasattr(ray._raylet, "AuthenticationTokenLoader")


def _reload_ray_auth() -> None:
    """Make Ray read its authentication settings from the environment again (its C++
    config read them when Ray was imported)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    AuthenticationTokenLoader.instance().reset_cache()
    Config.initialize("")


@contextmanager
def loopback_ray(private: bool) -> Iterator[dict[str, Any]]:
    """``ray.init`` arguments for a Ray instance that listens on 127.0.0.1 only and admits
    only processes holding a fresh random token (Ray's token authentication, the token in
    this process's environment, inherited by Ray's processes, written nowhere), with its
    temporary folder inside a fresh 0700 one (removed afterwards unless ``--debug``);
    ``private``: umask 077 meanwhile, so that the files there are 0600.

    ``_node_ip_address="127.0.0.1"`` alone is not enough: Ray replaces a loopback address by
    the machine's own unless its cluster switch is off (:data:`RAY_LOOPBACK_ENV`, read at
    import, so the imported flag is switched too), and its gRPC servers bind the node's
    address, all interfaces before that."""
    from ray._private import ray_constants

    saved_env = {name: os.environ.get(name) for name in (RAY_LOOPBACK_ENV, *RAY_TOKEN_ENV)}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[RAY_LOOPBACK_ENV] = "0"  # the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False
    # token authentication: a process of another user that reaches a loopback port cannot
    # join without the token, which lives only in the environment of this run's processes
    if _ray_has_tokens():
        os.environ.update({RAY_TOKEN_ENV[0]: "token", RAY_TOKEN_ENV[1]: secrets.token_hex(32)})
        _reload_ray_auth()
    else:
        logging.getLogger("fedkit").warning(
            "this Ray has no token authentication (Ray >= 2.52): any local process that "
            "reaches its loopback ports can join it and run code as this run's user"
        )
    # Ray's processes chmod each folder they make 0777 ("so others can use it"), whatever
    # the umask: its temporary folder goes inside a 0700 one that nobody else can enter.
    # The path stays short: Ray's socket paths must fit in 107 bytes.
    temp = tempfile.mkdtemp(prefix="fedkit-ray-")
    mask = os.umask(0o077) if private else None
    try:
        ray_temp = os.path.join(temp, "ray")
        yield {"_node_ip_address": "127.0.0.1", "include_dashboard": False, "_temp_dir": ray_temp}
    finally:
        if mask is not None:
            os.umask(mask)
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if _ray_has_tokens():
            _reload_ray_auth()
        if os.environ.get("FEDKIT_DEBUG") == "1":
            logging.getLogger("fedkit").warning("Ray's logs are kept in %s", temp)
        else:
            shutil.rmtree(temp, ignore_errors=True)


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
