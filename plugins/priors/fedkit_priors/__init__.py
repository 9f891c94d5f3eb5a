"""fedkit-priors: frozen pretrained knowledge for fedkit's methods, and the commands that
make it.

* :mod:`fedkit_priors.encoders`: frozen pretrained image encoders (Fed-MAS's prior);
* :mod:`fedkit_priors.knowledge`: foundation-model answers on public data, built once into a
  file (FedHelp's knowledge);
* :mod:`fedkit_priors.pretrain`: self-supervised pre-training of a prior encoder (lightly);
* :mod:`fedkit_priors.cli`: ``fedkit prior pretrain`` and ``fedkit knowledge build``, added to
  the ``fedkit`` command through the ``fedkit_register_commands`` hook.

Method plugins import the names below from here. They load on first use, so that importing
:mod:`fedkit_priors.cli` (``fedkit --help``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "FrozenEncoder": "encoders",
    "check_source": "encoders",
    "encoder_feature_dim": "encoders",
    "frozen_encoder": "encoders",
    "Knowledge": "knowledge",
    "build_knowledge": "knowledge",
    "fit_images": "knowledge",
    "load_knowledge": "knowledge",
    "load_public": "knowledge",
    "save_knowledge": "knowledge",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'fedkit_priors' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fedkit_priors.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
