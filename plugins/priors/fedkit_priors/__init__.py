"""fedkit-priors: frozen pretrained knowledge for fedkit's methods, and the commands that
make it.

* :mod:`fedkit_priors.encoders`: frozen pretrained image encoders (Fed-MAS's prior);
* :mod:`fedkit_priors.knowledge`: foundation-model answers on public data, built once into a
  file (FedHelp's knowledge);
* :mod:`fedkit_priors.pretrain`: self-supervised pre-training of a prior encoder (lightly);
* :mod:`fedkit_priors.cli`: ``fedkit prior pretrain`` and ``fedkit knowledge build``, added to
  the ``fedkit`` command through the ``fedkit_register_commands`` hook.

Method plugins import the names below from here.
"""

from __future__ import annotations

from fedkit_priors.encoders import (
    FrozenEncoder,
    check_source,
    encoder_feature_dim,
    frozen_encoder,
)
from fedkit_priors.knowledge import (
    Knowledge,
    build_knowledge,
    fit_images,
    load_knowledge,
    load_public,
    save_knowledge,
)

__all__ = [
    "FrozenEncoder",
    "Knowledge",
    "build_knowledge",
    "check_source",
    "encoder_feature_dim",
    "fit_images",
    "frozen_encoder",
    "load_knowledge",
    "load_public",
    "save_knowledge",
]
