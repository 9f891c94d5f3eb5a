"""The Flower engine: fedkit runs as a Flower ServerApp + ClientApp (``engine=flower``).

The same :class:`~fedkit_core.engines.server.Server` and
:class:`~fedkit_core.engines.client.ClientRuntime` as the in-process engine run on both
ends; only the transport differs: fedkit messages become Flower messages (named arrays in
an ``ArrayRecord``, scalars in a ``MetricRecord`` / ``ConfigRecord``). ``fedkit run --engine
flower`` runs in Flower's simulation runtime (and ``fedkit resume`` continues it);
``fedkit flower submit`` sends the same run to a SuperLink with one SuperNode per site (see
``docs/engines.md``).

The engine uses Flower's public API (:mod:`.simulation`, :mod:`.serverapp`, :mod:`.node`,
:mod:`.deploy`) and works on every Flower release from :data:`FLWR_MINIMUM` on; the
speed-ups that need Flower's internals are opt-in and version-checked (:mod:`.fast`).

This module imports nothing from ``flwr``, so the options below are known (and ``fedkit
--help`` works) without the optional dependency: ``pip install fedkit[flower]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError

if TYPE_CHECKING:
    from fedkit_core.config import Config
    from fedkit_core.contract.observer import Observer
    from fedkit_core.plugin_manager import PluginSet
    from fedkit_core.results.schema import Results
    from fedkit_core.results.store import RunDir

#: the Flower releases this engine is tested against (see docs/engines.md); pyproject.toml's
#: ``flower`` extra says the same
FLWR_REQUIREMENT = "flwr[simulation]>=1.41,<1.43"
#: the oldest Flower release with the public API the engine uses
FLWR_MINIMUM = (1, 41)

OPTIONS = (
    Option(
        "backend",
        str,
        "ray",
        "simulation backend: ray (Flower's own, one worker process per CPU) or thread "
        "(ClientApps run one at a time in this process; no Ray needed; part of the fast "
        "layer: on a Flower release it was not written for, ray with one warning)",
        choices=("ray", "thread"),
    ),
    Option(
        "fast",
        bool,
        False,
        "opt in to the speed-ups that use Flower internals in a deployment: the ServerApp "
        "retries a reply's missing objects after 20 ms, not 1 s (pair with `fedkit flower "
        "supernode --warm`). Written for Flower 1.41 and 1.42; on another release it is "
        "off, with one warning",
    ),
    Option(
        "client_cpus",
        float,
        None,
        "CPUs reserved per ClientApp, and its torch threads (ray backend; default: this "
        "process's torch threads, at most its cores, so results are the local engine's)",
        min=0,
    ),
    Option("client_gpus", float, 0.0, "GPUs reserved per ClientApp (ray backend)", min=0),
    Option(
        "nodes",
        int,
        None,
        "SuperNodes to wait for before the first round (default: one per client in "
        "simulation; required for a deployment)",
        min=1,
    ),
    Option("wait", float, 300.0, "seconds to wait for the SuperNodes to connect", min=0),
)


def require_flwr() -> None:
    """Fail with an install hint when Flower is missing or of an untested release."""
    try:
        from importlib.metadata import version

        import flwr  # noqa: F401
    except ImportError:
        raise FedkitError(
            f"engine=flower needs Flower: pip install 'fedkit[flower]' (installs {FLWR_REQUIREMENT})"
        ) from None
    found = version("flwr")
    release = tuple(int(p) for p in found.split(".")[:2] if p.isdigit())
    if release < FLWR_MINIMUM:
        raise FedkitError(
            f"engine=flower needs Flower {'.'.join(map(str, FLWR_MINIMUM))} or later, found "
            f"flwr {found}; pip install 'fedkit[flower]' (installs {FLWR_REQUIREMENT})"
        )


class FlowerEngine:
    """``engine=flower``: the run in Flower's simulation runtime (see :mod:`.simulation`)."""

    options = OPTIONS

    def execute(
        self,
        cfg: Config,
        plugins: PluginSet,
        run_dir: RunDir | None,
        observer: Observer,
        resume: bool,
    ) -> Results:
        require_flwr()
        from fedkit_core.engines.flower.simulation import simulate  # needs flwr

        return simulate(cfg, plugins, run_dir, observer, resume=resume)


ENGINE = FlowerEngine()
