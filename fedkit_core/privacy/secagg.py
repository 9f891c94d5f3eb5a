"""The ``secagg.*`` options (secure aggregation, see
:mod:`fedkit_core.engines.flower.secure`), as a built-in plugin
(``secagg`` in :data:`fedkit_core.plugin_manager.BUILTINS`)."""

from __future__ import annotations

from fedkit_core.hooks.hookspecs import hookimpl
from fedkit_core.privacy.options import SECAGG_OPTIONS


@hookimpl
def fedkit_options():
    return list(SECAGG_OPTIONS)
