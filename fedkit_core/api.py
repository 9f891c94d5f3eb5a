"""Build and run federations from Python: the functions the CLI is a thin layer over.

>>> from fedkit_core import run
>>> results = run({"task": "synthetic", "rounds": 2})          # doctest: +SKIP
>>> results.final["global"]["bacc"]                             # doctest: +SKIP

A run's config is resolved once (:mod:`fedkit_core.resolve`), its run directory created,
and the run handed to its engine (:mod:`fedkit_core.engines.registry`); nothing here knows
how an engine works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedkit_core.config import Config
from fedkit_core.engines.registry import get_engine
from fedkit_core.engines.server import Observer
from fedkit_core.errors import FedkitError
from fedkit_core.plugins import PluginSet
from fedkit_core.resolve import ConfigLike, resolve_config
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir


def run(
    config: ConfigLike | Sequence[ConfigLike] = None,
    *,
    plugins: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    observer: Observer | None = None,
) -> Results:
    """Run a federation and return its results.

    ``config``: a dict of config keys (nested or dotted), a YAML path, or a list of those.
    ``plugins``: extra plugin objects by name (e.g. defined in the embedding code).
    ``out``: a directory for results.json, metrics.csv, plots and checkpoints; ``None``
    keeps everything in memory.
    """
    cfg, plugin_set = resolve_config(config, plugins)
    return run_resolved(cfg, plugin_set, out=out, observer=observer)


def run_resolved(
    cfg: Config,
    plugin_set: PluginSet,
    *,
    out: str | Path | None = None,
    observer: Observer | None = None,
) -> Results:
    """Run a config already resolved by :func:`~fedkit_core.resolve.resolve_config` (what the
    CLI does, having resolved it to name the run directory)."""
    engine = get_engine(cfg["engine"])
    run_dir = RunDir(out) if out is not None else None
    if run_dir is not None:
        run_dir.create()
        run_dir.save_config(cfg.nested())
    return engine.execute(cfg, plugin_set, run_dir, observer or Observer(), resume=False)


def resume(
    out: str | Path, *, plugins: Mapping[str, Any] | None = None, observer: Observer | None = None
) -> Results:
    """Continue the run in ``out`` from its last completed round (same final results as an
    uninterrupted run), on the engine it was started on. A complete run is returned as it is."""
    run_dir = RunDir(out)
    saved = run_dir.load_config()
    if run_dir.results.is_file() and run_dir.load_results().get("status") == "complete":
        return Results(run_dir.load_results())
    cfg, plugin_set = resolve_config(saved, plugins)
    if not cfg["checkpoint"]:
        raise FedkitError(f"{out} was run with checkpoint=false and cannot be resumed")
    engine = get_engine(cfg["engine"])
    return engine.execute(cfg, plugin_set, run_dir, observer or Observer(), resume=True)
