"""fedkit: plugin-oriented federated learning for imbalanced, heterogeneous medical images.

The pieces a plugin author needs are importable from here: :data:`hookimpl`,
:class:`Option`, :class:`Reply`, :class:`FedModel`, :class:`FedkitError`. The embedding API
is :func:`run`, :func:`resume` and :class:`Results`.
"""

from __future__ import annotations

import importlib
from typing import Any

from fedkit_core.contract.hookspecs import API_VERSION, hookimpl
from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError

__all__ = [
    "API_VERSION",
    "FedModel",
    "FedkitError",
    "Option",
    "Reply",
    "Results",
    "hookimpl",
    "resolve_config",
    "resume",
    "run",
]

_LAZY = {
    "run": "fedkit_core.api",
    "resume": "fedkit_core.api",
    "resolve_config": "fedkit_core.resolve",
    "Results": "fedkit_core.results.schema",
    "Reply": "fedkit_core.contract.messages",
    "FedModel": "fedkit_core.models.fedmodel",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedkit_core' has no attribute {name!r}")
