"""Everything a method plugin may use, in one public module (hook API 2).

A plugin imports from here (or from :mod:`fedkit_core`) and nothing else of fedkit's;
the modules behind these names may move between releases, these names do not::

    from fedkit_core.plugin import ClientContext, Option, hookimpl

    @hookimpl
    def fedkit_options():
        return [Option("mu", float, 0.01, "proximal weight", min=0.0)]

    @hookimpl
    def fedkit_loss_terms(client: ClientContext, batch, outputs):
        ...  # client.options()["mu"]: this plugin's options, under its registered name

The hooks themselves are documented in :mod:`fedkit_core.hooks.hookspecs`. A plugin's
tests add :mod:`fedkit_core.testing`; nothing else of fedkit_core is for plugins
(``tests/test_plugin_imports.py``). Importing this module loads neither the engines' client
and server nor the results: :func:`markdown_table` (for a plugin's own table of a ``fedkit
compare`` folder) loads the results when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedkit_core.aggregation import average_entry, weighted_average
from fedkit_core.config import Config
from fedkit_core.contract.channels import INDIVIDUAL, QUERY, REPORT, Channel
from fedkit_core.contract.data import (
    CLASSIFICATION,
    SEGMENTATION,
    Batch,
    ClientData,
    ClientInfo,
    Normalizer,
    Split,
    TaskInfo,
)
from fedkit_core.contract.messages import Arrays, Payload, Reply, Scalar, Update
from fedkit_core.contract.options import Option
from fedkit_core.contract.scope import plugin_scope
from fedkit_core.engines.rounds import Federation, RoundMode
from fedkit_core.engines.snapshot import read_snapshot
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext, ServerContext, derive_seed, lr_at
from fedkit_core.hooks.hookspecs import API_VERSION, Ask, hookimpl
from fedkit_core.losses import balanced_softmax_ce, dice_loss, log_prior
from fedkit_core.losses.weight_maps import weight_map, weight_maps
from fedkit_core.models import build_model
from fedkit_core.models.fedmodel import FedModel

if TYPE_CHECKING:
    from fedkit_core.results.tables import markdown_table

__all__ = [
    "API_VERSION",
    "Arrays",
    "Ask",
    "Batch",
    "CLASSIFICATION",
    "Channel",
    "INDIVIDUAL",
    "QUERY",
    "REPORT",
    "ClientContext",
    "ClientData",
    "ClientInfo",
    "Config",
    "FedModel",
    "Federation",
    "FedkitError",
    "Normalizer",
    "Option",
    "Payload",
    "Reply",
    "RoundMode",
    "SEGMENTATION",
    "Scalar",
    "ServerContext",
    "Split",
    "TaskInfo",
    "Update",
    "average_entry",
    "build_model",
    "balanced_softmax_ce",
    "derive_seed",
    "dice_loss",
    "hookimpl",
    "log_prior",
    "lr_at",
    "markdown_table",
    "plugin_scope",
    "read_snapshot",
    "weight_map",
    "weight_maps",
    "weighted_average",
]

#: names loaded when first used, to keep this module light: name -> module
_LAZY = {"markdown_table": "fedkit_core.results.tables"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedkit_core.plugin' has no attribute {name!r}")
