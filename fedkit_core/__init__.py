"""fedkit: plugin-oriented federated learning for imbalanced, heterogeneous medical images.

The pieces a plugin author needs are importable from here: :data:`hookimpl`,
:class:`Option`, :class:`Reply`, :class:`FedModel`, :class:`FedkitError`. The embedding API
is :func:`run`, :func:`resume` and :class:`Results`.

Companion packages that build on the core's pieces rather than its hooks (``fedkit-priors``:
frozen encoders, knowledge files, pre-training) find them here too: the core's architectures
(:class:`CifarResNet`, the offline EfficientNet-Lites), checkpoint reading, a user model's
factory, task loading, ``--set`` parsing and the optional-library guard :func:`require`.
"""

from __future__ import annotations

import importlib
from typing import Any

from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.hookspecs import API_VERSION, hookimpl

__all__ = [
    "API_VERSION",
    "CIFAR_RESNETS",
    "CifarResNet",
    "FedModel",
    "FedkitError",
    "LITE",
    "LITE_MEAN",
    "LITE_STD",
    "Option",
    "Reply",
    "Results",
    "build_backbone",
    "build_lite",
    "hookimpl",
    "input_statistics",
    "load_factory",
    "load_state_file",
    "load_task",
    "parse_sets",
    "require",
    "resolve_config",
    "resume",
    "run",
    "to_timm",
]

_LAZY = {
    "run": "fedkit_core.api",
    "resume": "fedkit_core.api",
    "resolve_config": "fedkit_core.resolve",
    "Results": "fedkit_core.results.schema",
    "Reply": "fedkit_core.contract.messages",
    "FedModel": "fedkit_core.models.fedmodel",
    # building blocks for companion packages (see the module docstring)
    "CIFAR_RESNETS": "fedkit_core.models.networks",
    "CifarResNet": "fedkit_core.models.networks",
    "load_state_file": "fedkit_core.models.networks",
    "LITE": "fedkit_core.models.imagenet",
    "LITE_MEAN": "fedkit_core.models.imagenet",
    "LITE_STD": "fedkit_core.models.imagenet",
    "build_lite": "fedkit_core.models.imagenet",
    "to_timm": "fedkit_core.models.imagenet",
    "build_backbone": "fedkit_core.models",
    "input_statistics": "fedkit_core.models",
    "load_factory": "fedkit_core.models.user",
    "load_task": "fedkit_core.tasks.loading",
    "parse_sets": "fedkit_core.config",
    "require": "fedkit_core.extras",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedkit_core' has no attribute {name!r}")
