"""A run's config from its layers: the one place a run's config is resolved.

Which options a run has (the core's, its task's, its plugins' and its engine's), the values
that default to ``auto``, the task's data path and the ranges of the core's numeric keys are
decided here, once per run; engines and the CLI receive the resolved :class:`Config`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedkit_core.config import CORE_OPTIONS, Config, load_yaml, peek, resolve
from fedkit_core.contract.context import ServerContext
from fedkit_core.contract.data import CLASSIFICATION, SEGMENTATION, TaskInfo
from fedkit_core.contract.options import Option
from fedkit_core.engines.asynchronous import check_aggregation
from fedkit_core.engines.registry import engine_names, engine_options
from fedkit_core.errors import FedkitError
from fedkit_core.plugins import PluginSet
from fedkit_core.privacy.checks import check_privacy
from fedkit_core.sites import load_sites
from fedkit_core.tasks.registry import TaskSpec, get_task

ConfigLike = Mapping[str, Any] | str | Path | None


def resolve_config(
    config: ConfigLike | Sequence[ConfigLike] = None, plugins: Mapping[str, Any] | None = None
) -> tuple[Config, PluginSet]:
    """Validate ``config`` (a dict, a YAML path, or a list of them, later ones winning) and
    activate its plugins (plus ``plugins``: throwaway ``{name: object}`` plugins)."""
    layers = _layers(config)
    names = peek(layers, "plugins", []) or []
    names = Option("plugins", "list[str]", []).coerce(names, "plugins")
    names = [n for n in names if n != "fedavg"] + [n for n in (plugins or {}) if n not in names]
    plugin_set = PluginSet(names, plugins)
    spec = get_task(str(peek(layers, "task.name", "synthetic")))
    task_options = [o.renamed(f"task.{o.name}") for o in spec.options]
    layers.append({"plugins": names})
    # a named partition's values are defaults too: anything the user sets wins
    preset = peek(layers, "partition.preset")
    defaults = {**spec.defaults, **spec.partition_preset(None if preset is None else str(preset))}
    engine = engine_options(str(peek(layers, "engine", "local")))
    options = [*_core_options(), *task_options, *plugin_set.options(), *engine]
    cfg = resolve(layers, options, defaults)
    values = _fill_auto(dict(cfg), spec)
    _check_ranges(values)
    _check_pooled(values, plugin_set)
    resolved = Config(values, cfg.options)
    check_plugins(resolved, plugin_set, spec)
    check_aggregation(resolved, plugin_set)
    return resolved, plugin_set


def check_plugins(config: Config, plugins: PluginSet, spec: TaskSpec) -> None:
    """Run every plugin's ``fedkit_check`` before any data is loaded (the task is known by
    name and kind only); all problems are reported together."""
    preview = TaskInfo(spec.name, spec.kind, [], 0, ())
    ctx = ServerContext(preview, config, torch.device("cpu"))
    problems: list[str] = []
    for result in plugins.hook.fedkit_check(server=ctx):
        if result:
            problems += [result] if isinstance(result, str) else list(result)
    problems += check_privacy(config, plugins, ctx)
    if problems:
        raise FedkitError("\n".join(problems))


def _check_pooled(values: Mapping[str, Any], plugins: PluginSet) -> None:
    """``pooled=true`` (the centralised reference) trains the task's own model in one
    process: the local engine, no method plugins."""
    if not values["pooled"]:
        return
    if values["engine"] != "local":
        raise FedkitError(
            f"pooled=true is the centralised reference: one model trained on every client's "
            f"data in one process, which only engine=local does (got engine={values['engine']}); "
            "a deployment keeps each client's data on its site, so it has no pooled run"
        )
    if plugins.active:
        raise FedkitError(
            "pooled=true trains the task's own model (model, loss, optimiser keys) without "
            f"method plugins, got plugins {', '.join(plugins.active)}; compare the methods "
            "beside it instead (fedkit compare fedavg pooled ...)"
        )


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
    if spec.kind == CLASSIFICATION and values["loss"] in ("dice", "dice_ce"):
        raise FedkitError(
            f"loss={values['loss']} is for segmentation; task {spec.name!r} is classification"
        )
    return values


#: the largest ``task.image_size``: a 3-channel float image of this side is 200 MB
MAX_IMAGE_SIZE = 4096

#: (keys, test, what the values must be) for the core's numeric keys; None is always allowed
_RANGES: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (
        (
            "rounds",
            "local_epochs",
            "batch_size",
            "eval_batch_size",
            "eval_every",
            "clients",
            "evaluation_bins",
        ),
        lambda v: v >= 1,
        "at least 1",
    ),
    (
        ("task.image_size",),
        lambda v: 1 <= v <= MAX_IMAGE_SIZE,
        f"in [1, {MAX_IMAGE_SIZE}] (or null: no resizing)",
    ),
    (
        ("seed", "min_clients", "partition.min_size", "client_retries"),
        lambda v: v >= 0,
        "0 or more",
    ),
    (("client_timeout",), lambda v: v > 0, "above 0 (or null: no limit)"),
    (("lr", "partition.alpha", "lr_gamma"), lambda v: v > 0, "above 0"),
    (("momentum", "weight_decay"), lambda v: v >= 0, "0 or more"),
    (("grad_clip",), lambda v: v > 0, "above 0 (or null: no clipping)"),
    (("adam_betas",), lambda v: len(v) == 2 and all(0 <= x < 1 for x in v), "two values in [0, 1)"),
    (
        ("unet_channels",),
        lambda v: len(v) > 0 and all(x >= 1 for x in v),
        "at least 1 each, not empty",
    ),
    (("partition.alphas", "partition.fractions"), lambda v: all(x > 0 for x in v), "all above 0"),
    (("sample_fraction",), lambda v: 0 < v <= 1, "in (0, 1]"),
    (("task.val_fraction", "task.test_fraction"), lambda v: 0 < v < 1, "in (0, 1)"),
    (("partition.drop_prob",), lambda v: 0 <= v < 1, "in [0, 1)"),
    (("task.std",), lambda v: all(x > 0 for x in v), "all above 0"),
)


def _check_ranges(values: Mapping[str, Any]) -> None:
    for keys, ok, what in _RANGES:
        for key in keys:
            if values.get(key) is not None and not ok(values[key]):
                raise FedkitError(f"{key} must be {what}, got {values[key]}")
