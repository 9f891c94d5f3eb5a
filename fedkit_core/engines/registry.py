"""Where a federation can run: the engines, by name, and the config options each adds.

An engine module exposes ``OPTIONS`` (config options, set as ``<engine>.<option>`` and
valid only when that engine is chosen) and ``execute(cfg, plugins, run_dir, observer)``, which runs
a resolved config and returns its results. ``local`` is the in-process engine that
:mod:`fedkit_core.api` drives itself; the others are imported only when chosen, so an engine's
optional dependencies (e.g. ``flwr``) are needed only by the runs that use it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fedkit_core.errors import FedkitError, unknown
from fedkit_core.options import Option

#: engine name -> module (``None``: built into :mod:`fedkit_core.api`)
ENGINES: dict[str, str | None] = {
    "local": None,
    "flower": "fedkit_core.engines.flower",
}


def get_engine(name: str) -> ModuleType:
    """The module of a non-local engine."""
    if name not in ENGINES:
        raise unknown("engine", name, ENGINES)
    module = ENGINES[name]
    if module is None:
        raise FedkitError(f"engine {name!r} is run by fedkit_core.api itself")
    return importlib.import_module(module)


def engine_options(name: str) -> list[Option]:
    """The config options an engine adds (none for ``local`` or an unknown name)."""
    if ENGINES.get(name) is None:
        return []
    return [
        Option(f"{name}.{o.name}", o.type, o.default, o.help, o.choices, o.nullable)
        for o in get_engine(name).OPTIONS
    ]
