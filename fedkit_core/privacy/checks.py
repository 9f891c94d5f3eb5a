"""The channels a run's plugins declare (what a private run may carry besides the model's
update); the rules a private run must keep are :func:`fedkit_core.rules.check_privacy`."""

from __future__ import annotations

from fedkit_core.contract.channels import Channel
from fedkit_core.hooks.context import ServerContext
from fedkit_core.plugin_manager import BUILTINS, PluginSet


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
