"""fedkit's opt-in speed-ups that rely on Flower's internals, checked against the Flower
release they were written for.

The Flower engine runs on Flower's public API alone by default (ServerApp/ClientApp, Grid,
Message, ``flwr.simulation.run_simulation``, the ``flwr`` CLI, ``flower-superlink`` and
``flower-supernode``). Three speed-ups reach into Flower's modules, whose names and
behaviour may change in any release, so each is opt-in and asks :func:`fast_layer` first:

* ``flower.backend=thread``: the simulation's ClientApps run in a thread of this process
  (:class:`ThreadBackend`, no Ray); Flower's simulation runtime hard-wires Ray, so its Ray
  backend module is replaced while the run lasts (:func:`thread_backend`);
* ``flower.fast=true``: a deployed ServerApp retries a message's objects that are not all
  stored yet after 20 ms, not Flower's 1 s (:func:`retry_object_pulls_sooner`);
* ``fedkit flower supernode --warm``: one long-lived executor in place of Flower's
  SuperExec, wake-ups instead of polls (:mod:`.warm`).

``fedkit flower superlink``'s two addresses and fixed node keys (:mod:`.link`) build
Flower's SuperLink from its modules too, behind the same release check (:func:`supported`);
elsewhere it is Flower's own ``flower-superlink`` (:func:`.deploy.public_superlink`).

On a Flower release outside :data:`WRITTEN_FOR` :func:`fast_layer` says no, with one
warning per process, and the run takes the public path (the Ray backend, Flower's own
object pulls, Flower's plain SuperNode): the same results, more slowly.
"""

from __future__ import annotations

import copy
import functools
import logging
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fedkit_core.errors import failure_text

log = logging.getLogger("fedkit")

#: the Flower releases (``major.minor``) whose internals the fast layer was written and
#: tested against: 1.42 changed none of the modules it uses (only tracing)
WRITTEN_FOR = ("1.41", "1.42")
#: whether this process has warned that the fast layer is off
_warned = False


def flower_version() -> str:
    try:
        return version("flwr")
    except PackageNotFoundError:
        return "none"


def supported(found: str) -> bool:
    """Whether the fast layer was written for Flower release ``found`` (e.g. ``1.42.0``)."""
    return ".".join(found.split(".")[:2]) in WRITTEN_FOR


def fast_layer(feature: str) -> bool:
    """Whether ``feature`` of the fast layer may run on the installed Flower; if not, warn
    once per process (naming the first feature turned off) and say no."""
    global _warned
    found = flower_version()
    if supported(found):
        return True
    if not _warned:
        _warned = True
        log.warning(
            "fedkit's Flower fast layer (%s) is written for Flower %s, found flwr %s: it is "
            "off, the run takes Flower's public path (same results, slower)",
            feature,
            " and ".join(WRITTEN_FOR),
            found,
        )
    return False


# ---------------------------------------------------------------------------- simulation

#: the module Flower's simulation runtime imports its ``RayBackend`` from, at its start
RAY_BACKEND_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"


def thread_backend_class() -> type[Any]:
    """:class:`ThreadBackend`, built on Flower's ``Backend`` base class."""
    from flwr.clientapp.client_app import ClientAppException
    from flwr.server.superlink.fleet.vce.backend import Backend

    class ThreadBackend(Backend):
        """Runs each ClientApp call in this thread, one message at a time, on a copy of
        the node context (a failed message leaves the context as it was).

        One at a time keeps runs deterministic: clients seed torch's global generator
        before building their model, which concurrent threads would interleave. A client
        that must be stoppable (``client_timeout``) runs isolated inside the ClientApp
        (:mod:`fedkit_core.engines.isolation`), not here."""

        def __init__(self, backend_config: dict[str, Any]) -> None:
            super().__init__(backend_config)
            self.app_fn: Callable[[], Any] | None = None

        def build(self, app_fn: Callable[[], Any]) -> None:
            self.app_fn = app_fn

        @property
        def num_workers(self) -> int:
            return 1

        def is_worker_idle(self) -> bool:
            return True

        def terminate(self) -> None:
            self.app_fn = None

        def process_message(self, message: Any, context: Any) -> tuple[Any, Any]:
            if self.app_fn is None:
                raise RuntimeError("ThreadBackend.build() was not called")
            work = copy.deepcopy(context)
            try:
                reply = self.app_fn()(message=message, context=work)
            except BaseException as err:  # noqa: BLE001 - what Ray's workers raise
                raise ClientAppException(failure_text(err)) from err
            return reply, work

    return ThreadBackend


@contextmanager
def thread_backend() -> Iterator[str]:
    """The backend name to pass to ``run_simulation`` for :class:`ThreadBackend`, which is
    in place of Flower's ``RayBackend`` until the run ends (Flower's runtime imports it
    from :data:`RAY_BACKEND_MODULE` when it starts)."""
    stand_in = types.ModuleType(RAY_BACKEND_MODULE)
    stand_in.RayBackend = thread_backend_class()  # type: ignore[attr-defined]
    saved = sys.modules.get(RAY_BACKEND_MODULE)
    sys.modules[RAY_BACKEND_MODULE] = stand_in
    try:
        yield "thread"  # any name but "ray" (Flower's check for the ray package)
    finally:
        if saved is None:
            sys.modules.pop(RAY_BACKEND_MODULE, None)
        else:
            sys.modules[RAY_BACKEND_MODULE] = saved


# ---------------------------------------------------------------------------- deployment

#: the first wait before pulling again an object of a message that is not all there yet,
#: doubling up to the second (Flower: 1 s doubling to 10 s)
OBJECT_RETRY, OBJECT_RETRY_CAP = 0.02, 1.0


def retry_object_pulls_sooner(module: types.ModuleType) -> None:
    """Make Flower's ``pull_objects``, as ``module`` calls it, retry a missing object after
    :data:`OBJECT_RETRY` seconds rather than 1 s. Flower announces a message (to the
    SuperLink, or a reply to it) before it pushes the message's objects, so a receiver that
    polls soon after finds some missing, and waited 1 s for them. The overall limit, Flower's
    ``max_time`` of 2 hours, stays."""
    from flwr.supercore.inflatable.inflatable_utils import pull_objects

    module.pull_objects = functools.partial(  # type: ignore[attr-defined]
        pull_objects,
        initial_backoff=OBJECT_RETRY,
        backoff_cap=OBJECT_RETRY_CAP,
        max_tries_per_object=None,
    )
