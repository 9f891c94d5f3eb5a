"""What an engine is: the one interface every engine, built in or installed, implements.

An engine runs a resolved config: it prepares the federation, drives the
:class:`~fedkit_core.engines.server.Server` over its own transport and returns the results.
Engines are peers: :mod:`fedkit_core.api` finds them through
:mod:`fedkit_core.engines.registry` and knows nothing else about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fedkit_core.contract.options import Option

if TYPE_CHECKING:
    from fedkit_core.config import Config
    from fedkit_core.contract.observer import Observer
    from fedkit_core.plugin_manager import PluginSet
    from fedkit_core.results.schema import Results
    from fedkit_core.results.store import RunDir


@runtime_checkable
class Engine(Protocol):
    """Where a federation runs.

    ``options`` are the engine's own config options, set as ``<engine>.<option>`` and valid
    only when the engine is chosen. ``execute`` runs ``cfg`` (already resolved) and returns
    its results, writing them to ``run_dir`` when there is one; with ``resume``, it continues
    the run in ``run_dir`` from its checkpoint.
    """

    options: Sequence[Option]

    def execute(
        self,
        cfg: Config,
        plugins: PluginSet,
        run_dir: RunDir | None,
        observer: Observer,
        resume: bool,
    ) -> Results: ...
