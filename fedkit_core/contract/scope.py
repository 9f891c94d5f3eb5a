"""The plugin scope: which plugin's hook is running.

Inside a hook, ``ctx.options()``, ``ctx.state`` and ``client.scratch`` belong to the plugin
whose hook is running, under the name it was registered with; the plugin manager
(:mod:`fedkit_core.plugin_manager`) sets the scope around every hook call of a registered plugin,
and the contexts (:mod:`fedkit_core.hooks.context`) read it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

#: The name of the plugin whose hook is running (what ``ctx.options()`` and ``ctx.state``
#: resolve against), set around every hook call of a registered plugin.
CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("fedkit_plugin", default=None)


def current_plugin() -> str | None:
    """The registered name of the plugin whose hook is running, or ``None`` in core code."""
    return CURRENT.get()


@contextmanager
def plugin_scope(name: str) -> Iterator[None]:
    """Run code as plugin ``name`` (tests calling a hook function directly use this)."""
    token = CURRENT.set(name)
    try:
        yield
    finally:
        CURRENT.reset(token)
