"""A run's config from its layers: the one place a run's config is resolved, in one pass.

The layers are read once for the choices that decide which options a run has (plugins,
task, engine, partition preset); the registries give those options once (the core's, the
task's, the plugins', the engine's); the config is merged, typed and bounds-checked once
(each option's own bounds: :class:`~fedkit_core.contract.options.Option`), its ``auto`` values and
data path filled in, and the rules between keys checked
(:func:`fedkit_core.rules.check_rules`). Engines and the CLI receive the resolved
:class:`Config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedkit_core.config import CORE_OPTIONS, Choices, Config, load_yaml, merge, read_choices
from fedkit_core.contract.data import SEGMENTATION
from fedkit_core.contract.options import Option
from fedkit_core.engines.modes import round_options
from fedkit_core.engines.registry import engine_names, engine_options
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.rules import check_rules
from fedkit_core.sites import load_sites
from fedkit_core.tasks.registry import TaskSpec, get_task

ConfigLike = Mapping[str, Any] | str | Path | None


def resolve_config(
    config: ConfigLike | Sequence[ConfigLike] = None, plugins: Mapping[str, Any] | None = None
) -> tuple[Config, PluginSet]:
    """Validate ``config`` (a dict, a YAML path, or a list of them, later ones winning) and
    activate its plugins (plus ``plugins``: throwaway ``{name: object}`` plugins)."""
    layers = _layers(config)
    schema = _schema(read_choices(layers), plugins)
    values, options = merge([*layers, {"plugins": schema.plugins}], schema.options, schema.defaults)
    resolved = Config(_fill_auto(values, schema.task), options)
    check_rules(resolved, schema.plugin_set, schema.task)
    return resolved, schema.plugin_set


@dataclass
class _Schema:
    """What a run's choices make of it: its plugins (activated), its task, every option it
    has, and the defaults that the task and its partition preset give."""

    plugins: list[str]
    plugin_set: PluginSet
    task: TaskSpec
    options: list[Option]
    defaults: dict[str, Any]


def _schema(chosen: Choices, extra: Mapping[str, Any] | None) -> _Schema:
    """Ask each registry once: the plugins (those chosen, ``fedavg`` meaning none, plus the
    ``extra`` objects), the task, its partition preset, the engine."""
    names = [n for n in chosen.plugins if n != "fedavg"]
    names += [n for n in (extra or {}) if n not in chosen.plugins]
    plugin_set = PluginSet(names, extra)
    spec = get_task(chosen.task)
    # a named partition's values are defaults too: anything the user sets wins
    defaults = {**spec.defaults, **spec.partition_preset(chosen.preset)}
    engine = engine_options(chosen.engine)
    task_options = [o.renamed(f"task.{o.name}") for o in spec.options]
    options = [*_core_options(), *round_options(), *task_options, *plugin_set.options(), *engine]
    return _Schema(names, plugin_set, spec, options, defaults)


def _layers(config: ConfigLike | Sequence[ConfigLike]) -> list[Mapping[str, Any]]:
    items = config if isinstance(config, (list, tuple)) else [config]
    out = []
    for item in items:
        if item is None:
            continue
        layer = load_yaml(item) if isinstance(item, (str, Path)) else dict(item)
        if layer.get("sites") is not None:  # a file's path: its profiles, kept in the config
            folder = Path(item).parent if isinstance(item, (str, Path)) else None
            layer["sites"] = load_sites(layer["sites"], base_dir=folder)
        out.append(layer)
    return out


def _core_options() -> list[Option]:
    """The core's options, ``engine`` choosing among the registered engines."""
    choices = tuple(engine_names())
    return [replace(o, choices=choices) if o.name == "engine" else o for o in CORE_OPTIONS]


def _fill_auto(values: dict[str, Any], spec: TaskSpec) -> dict[str, Any]:
    """``loss`` and ``model`` for the task's kind when ``auto``; the task's data path."""
    if values["loss"] == "auto":
        values["loss"] = "dice" if spec.kind == SEGMENTATION else "ce"
    values["task.path"] = spec.resolve_path(values["task.path"])
    if values["model"] == "auto":
        values["model"] = "unet" if spec.kind == SEGMENTATION else "cnn"
    return values
