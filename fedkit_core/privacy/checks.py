"""Whether a run can be private as configured: refused before any data is loaded, with the
reason (a plugin's channel, the engine, a missing library)."""

from __future__ import annotations

import importlib.util

from fedkit_core.config import Config
from fedkit_core.contract.channels import Channel, refusals
from fedkit_core.contract.context import ServerContext
from fedkit_core.plugin_manager import BUILTINS, PluginSet
from fedkit_core.privacy.options import NONE, SAMPLE

#: engines that carry secure aggregation
SECURE_ENGINES = ("flower",)


def declared_channels(plugins: PluginSet, ctx: ServerContext) -> list[tuple[str, Channel]]:
    """``(plugin, channel)`` for every channel the active plugins declare."""
    out: list[tuple[str, Channel]] = []
    for impl in reversed(plugins.hook.fedkit_channels.get_hookimpls()):
        if impl.plugin_name in BUILTINS:
            continue
        for channel in impl.function(server=ctx) or ():
            if not isinstance(channel, Channel):
                out.append((impl.plugin_name, Channel(str(channel), "(not a Channel)")))
            else:
                out.append((impl.plugin_name, channel))
    return out


def check_privacy(config: Config, plugins: PluginSet, ctx: ServerContext) -> list[str]:
    """Why this run cannot be private as configured (empty: it can, or it is not private)."""
    level, secure = config["dp.level"], bool(config["secagg.enabled"])
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
