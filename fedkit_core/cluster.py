"""Run a comparison's runs as tasks on an existing Ray cluster (``fedkit compare --executor
ray --address ADDR``).

Each (runspec, seed) is one Ray task that runs :func:`fedkit_core.parallel.run_child` (the
very function ``--jobs`` worker processes run) on whichever node has a free CPU (and a free
GPU, where the cluster has GPUs), with as many torch threads as CPUs it holds: at the same
thread count its run is bitwise the run ``--jobs`` gives. Runs are ordinary run directories
on storage every node sees at the same path (a shared file system, e.g. NFS): a task whose
worker or node is lost is retried (:data:`RETRIES` times) on another node, where
``api.run(reuse=True)`` continues the run from its last completed round. The lost attempt's
``run.lock`` is released once its process (or node) is known to be gone
(:func:`release_lost_lock`). Ray is imported only here, only when this executor is used.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedkit_core.errors import FedkitError
from fedkit_core.fileio import make_folder
from fedkit_core.parallel import OnDone, Plan, collect, run_child
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir

#: how many times Ray reruns a run whose worker process or node was lost
RETRIES = 3
#: seconds to wait for the cluster's address to answer before saying it does not
CONNECT_TIMEOUT = 5.0


def host_and_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` of a Ray cluster's head (``ray start --head`` prints it), or exit 2."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise FedkitError(
            f"--address must be the Ray head's HOST:PORT (as `ray start --head` prints it), "
            f"got {address!r}"
        )
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (then this process is on the head node)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` as its driver (once per process), or exit 2 naming
    the address when nothing answers there."""
    host, port = host_and_port(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:
        raise FedkitError(
            f"no Ray cluster answers at {address} ({err.strerror or err}); start one with "
            "`ray start --head` and give the address it prints"
        ) from None
    import ray

    if ray.is_initialized():
        return
    # a loopback address: this process is on the head node, reached at that very address
    # (Ray would otherwise pick this machine's network address for the driver)
    node = {"_node_ip_address": host} if is_loopback(host) else {}
    try:
        with warnings.catch_warnings():  # Ray's notice of a future default, not the user's
            warnings.simplefilter("ignore", FutureWarning)
            ray.init(address=f"{host}:{port}", logging_level="WARNING", log_to_driver=False, **node)
    except (ConnectionError, RuntimeError) as err:
        raise FedkitError(f"could not join the Ray cluster at {address}: {err}") from None


def release_lost_lock(path: Path) -> None:
    """Remove ``run.lock`` of ``path`` when the process holding it is gone: its node left the
    cluster, or a probe on its node finds the process dead. :class:`RunDir` takes over a dead
    process's lock on the same host by itself, but never one from another host; a run retried
    on another node after its node was lost needs this."""
    lock = RunDir(path).lock_file
    try:
        holder = json.loads(lock.read_text())
    except (OSError, ValueError):
        return
    host, pid = holder.get("host"), holder.get("pid")
    if host == socket.gethostname() or not isinstance(pid, int):
        return  # RunDir.lock decides: same host (it checks the pid), or an unreadable lock
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"] and n["NodeManagerHostname"] == host]
    if nodes:
        strategy = NodeAffinitySchedulingStrategy(nodes[0]["NodeID"], soft=False)
        probe = ray.remote(_alive).options(num_cpus=0, scheduling_strategy=strategy)
        if ray.get(probe.remote(pid)):
            return  # a live process writes the run: RunDir.lock refuses, naming it
    lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    from fedkit_core.fileio import process_alive

    return process_alive(pid)


def _run_task(layers: list[Mapping[str, Any]], path: Path, cwd: Path) -> str | None:
    """One run in a Ray task: from the driver's folder (relative paths in configs mean what
    they mean there), with a torch thread per CPU the task holds."""
    import ray
    import torch

    if not path.parent.is_dir() or not cwd.is_dir():
        return (
            f"{path.parent} is not visible on node {ray.util.get_node_ip_address()}: runs of "
            "--executor ray live on storage every node sees at the same path"
        )
    os.chdir(cwd)
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))
    release_lost_lock(path)
    return run_child(layers, path)


class RayCluster:
    """Each run of a plan as a Ray task (1 CPU, and 1 GPU where the cluster has GPUs) on the
    cluster at ``address``."""

    def __init__(self, address: str | None) -> None:
        if not address:
            raise FedkitError("--executor ray needs --address HOST:PORT of the Ray cluster's head")
        host_and_port(address)
        self.address = address

    def run(self, plan: Plan, on_done: OnDone = None) -> list[Results]:
        import ray

        connect(self.address)
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        task = ray.remote(_run_task).options(num_cpus=1, num_gpus=gpus, max_retries=RETRIES)
        plan = [(spec, seed, path.absolute(), layers) for spec, seed, path, layers in plan]
        for _, _, path, _ in plan:  # the task checks that its node sees this folder
            make_folder(path.parent)
        cwd = Path.cwd()
        refs = [task.remote(layers, path, cwd) for _, _, path, layers in plan]
        futures = {ref.future(): (spec, seed) for ref, (spec, seed, *_) in zip(refs, plan)}
        ref_of = dict(zip(futures, refs, strict=True))
        return collect(plan, futures, on_done, lambda future: ray.cancel(ref_of[future]))
