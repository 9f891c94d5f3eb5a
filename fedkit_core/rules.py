"""The rules between a run's keys, in one place: the checks of a resolved config that are
not one key's own bounds (those are the options', :class:`~fedkit_core.contract.options.Option`).

Every run's config passes :func:`check_rules` when it is resolved, before any data is
loaded: a list's length, keys that exclude each other (``loss`` and the task's kind,
``pooled``, ``aggregation`` with ``deadline``, secure aggregation and DP), the plugins' own
``fedkit_check`` and what a private run needs (libraries, engine, channels). A refusal is a
:class:`~fedkit_core.errors.FedkitError` saying why.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import torch

from fedkit_core.config import Config
from fedkit_core.contract.channels import NONE, SAMPLE, dp_level, refusals
from fedkit_core.contract.data import CLASSIFICATION, TaskInfo
from fedkit_core.engines.asynchronous import Asynchronous
from fedkit_core.engines.modes import mode_class
from fedkit_core.engines.rounds import Deadline
from fedkit_core.engines.selection import selection_rule
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ServerContext
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.privacy.checks import declared_channels
from fedkit_core.tasks.registry import TaskSpec

#: the lengths the core's list keys must have (their items' bounds are the options')
_LENGTHS = {"adam_betas": lambda n: n == 2, "unet_channels": lambda n: n > 0}
#: engines that carry secure aggregation
SECURE_ENGINES = ("flower",)


def check_rules(config: Config, plugins: PluginSet, spec: TaskSpec) -> None:
    """Refuse ``config`` when its keys break a rule between them (see the module
    docstring)."""
    for key, fits in _LENGTHS.items():
        if config[key] is not None and not fits(len(config[key])):
            raise config.options[key].refusal(config[key], key)
    if spec.kind == CLASSIFICATION and config["loss"] in ("dice", "dice_ce"):
        raise FedkitError(
            f"loss={config['loss']} is for segmentation; task {spec.name!r} is classification"
        )
    _check_pooled(config, plugins)
    check_plugins(config, plugins, spec)
    check_aggregation(config, plugins)


def check_plugins(config: Config, plugins: PluginSet, spec: TaskSpec) -> None:
    """Run every plugin's ``fedkit_check`` before any data is loaded (the task is known by
    name and kind only), and the privacy checks; all problems are reported together."""
    preview = TaskInfo(spec.name, spec.kind, [], 0, ())
    ctx = ServerContext(preview, config, torch.device("cpu"))
    problems: list[str] = []
    for result in plugins.hook.fedkit_check(server=ctx):
        if result:
            problems += [result] if isinstance(result, str) else list(result)
    problems += check_privacy(config, plugins, ctx)
    if problems:
        raise FedkitError("\n".join(problems))


def check_privacy(config: Config, plugins: PluginSet, ctx: ServerContext) -> list[str]:
    """Why this run cannot be private as configured (empty: it can, or it is not private):
    a plugin's channel, the engine, a missing library."""
    level, secure = dp_level(config), bool(config["secagg.enabled"])
    if level == NONE and not secure:
        return []
    problems: list[str] = []
    if level != NONE and importlib.util.find_spec("dp_accounting") is None:
        problems.append("dp.level needs Google's dp-accounting: pip install 'fedkit[dp]'")
    if level == SAMPLE and importlib.util.find_spec("opacus") is None:
        problems.append("dp.level=sample needs Opacus: pip install 'fedkit[dp]'")
    if secure and config["engine"] not in SECURE_ENGINES:
        problems.append(
            f"secagg.enabled runs Flower's SecAgg+ on engine=flower; engine={config['engine']} "
            "runs every party in one process, where masking the updates protects nothing: use "
            "--engine flower (or drop secagg.enabled)"
        )
    if config["task.shot_thresholds"]:
        problems.append(
            "task.shot_thresholds sends each client's class counts to the server at setup, a "
            "channel a private run does not carry; drop task.shot_thresholds"
        )
    problems += refusals(declared_channels(plugins, ctx), level, secure)
    return problems


def check_aggregation(config: Config, plugins: PluginSet) -> None:
    """Refuse a run whose round mode or selection rule is unknown, or that the mode's
    settings, its privacy or the run's plugins do not allow, saying why (see
    :mod:`fedkit_core.engines.asynchronous` for why a plugin's aggregation may not hold for
    buffered, stale updates); a plugin's own round mode adds its rules (``RoundMode.check``)."""
    mode, name = mode_class(config, plugins), config["aggregation"]
    selection_rule(config["selection"], plugins)
    if mode is Deadline and config["deadline"] is None:
        raise FedkitError("aggregation=deadline needs `deadline`: seconds a round waits")
    if mode is not Deadline and config["deadline"] is not None:
        raise FedkitError(f"`deadline` is for aggregation=deadline (aggregation is {name})")
    if not mode.secure and config["secagg.enabled"]:
        raise FedkitError(
            f"aggregation={name} cannot run with secure aggregation (secagg.enabled): SecAgg+ "
            "sums one synchronous round's updates"
        )
    if issubclass(mode, Asynchronous):
        level = dp_level(config)
        if level != NONE:
            raise FedkitError(
                f"aggregation={name} cannot run with differential privacy (dp.level="
                f"{level}): its accountant counts synchronous rounds of sampled clients"
            )
        problems = [
            f"aggregation={name} cannot run plugin {plugin!r}: {reason}"
            for plugin in plugins.active
            if (reason := _not_asynchronous(plugins, plugin))
        ]
        if problems:
            raise FedkitError(
                "\n".join(problems) + "\n(aggregation=sync or deadline run every method plugin)"
            )
    mode.check(config, plugins)


def _not_asynchronous(plugins: PluginSet, name: str) -> str | None:
    """Why plugin ``name``'s aggregation does not hold for asynchronous rounds (None: it
    does, or it does not aggregate): its own text, or what its hooks say."""
    declared = getattr(plugins.objects[name], "fedkit_asynchronous", None)
    hooks = plugins.info(name, "").hooks
    if declared is True:
        return None
    if isinstance(declared, str):
        return declared
    if "fedkit_answer_query" in hooks:
        return (
            "its aggregation asks the round's clients an extra question "
            "(fedkit_answer_query), which needs every client of one round to answer "
            "about the same global model"
        )
    if "fedkit_aggregate" in hooks:
        return (
            "its aggregation (fedkit_aggregate) was written for synchronous rounds; a "
            "plugin whose aggregation also holds for buffered, stale updates declares "
            "`fedkit_asynchronous = True`"
        )
    return None


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
