"""The ``dp.*`` options (differential privacy, see :mod:`fedkit_core.privacy`), as a
built-in plugin (``dp`` in :data:`fedkit_core.plugin_manager.BUILTINS`)."""

from __future__ import annotations

from fedkit_core.hooks.hookspecs import hookimpl
from fedkit_core.privacy.options import DP_OPTIONS


@hookimpl
def fedkit_options():
    return list(DP_OPTIONS)
