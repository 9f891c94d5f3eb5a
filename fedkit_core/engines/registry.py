"""Engines by name: the built-in ones plus those installed under entry-point group
``fedkit.engines``.

An entry point names an object implementing :class:`~fedkit_core.engines.base.Engine`
(``my_package.engine:ENGINE``). Engines are imported only when chosen, so an engine's
optional dependencies (e.g. ``flwr``) are needed only by the runs that use it. Installed
engines may not shadow the built-in ones.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points

from fedkit_core.contract.options import Option
from fedkit_core.engines.base import Engine
from fedkit_core.errors import FedkitError, unknown

ENTRY_POINT_GROUP = "fedkit.engines"

#: the built-in engines, as ``module:object``
BUILTIN_ENGINES: dict[str, str] = {
    "local": "fedkit_core.engines.local:ENGINE",
    "flower": "fedkit_core.engines.flower:ENGINE",
}


def installed_engines() -> dict[str, EntryPoint]:
    """The engines installed under :data:`ENTRY_POINT_GROUP`, by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def engine_names() -> list[str]:
    """Every known engine: the built-ins, then the installed ones."""
    return list(dict.fromkeys([*BUILTIN_ENGINES, *installed_engines()]))


def get_engine(name: str) -> Engine:
    """The engine called ``name``; an unknown name is an error listing the known ones."""
    if name in BUILTIN_ENGINES:
        module, _, attribute = BUILTIN_ENGINES[name].partition(":")
        return getattr(importlib.import_module(module), attribute)
    installed = installed_engines()
    if name not in installed:
        raise unknown("engine", name, engine_names())
    ep = installed[name]
    try:
        engine = ep.load()
    except Exception as err:  # a broken third-party package must not break the CLI
        raise FedkitError(
            f"installed engine {name!r} ({ep.value}) failed to load: {type(err).__name__}: {err}"
        ) from err
    if not isinstance(engine, Engine):
        raise FedkitError(
            f"entry point {name!r} of group {ENTRY_POINT_GROUP} ({ep.value}) is not an engine: "
            "it needs `options` and `execute(cfg, plugins, run_dir, observer, resume)`"
        )
    return engine


def engine_options(name: str) -> list[Option]:
    """The config options engine ``name`` adds, as ``<name>.<option>``."""
    return [o.renamed(f"{name}.{o.name}") for o in get_engine(name).options]
