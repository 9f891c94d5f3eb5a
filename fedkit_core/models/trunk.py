"""The frozen trunk of a model: the stem and first stages of its backbone when ``freeze``
covers them, split off so that their outputs can be computed once per image and reused
(the frozen-trunk cache, :mod:`fedkit_core.engines.trunk`).

A frozen module stays in eval mode (:meth:`FedModel.freeze`): its batch norms use their
running statistics and its dropout is off, so its output depends on the image and the frozen
weights alone. For a backbone that is a sequence ``stem -> stages -> head`` (timm's
EfficientNet family: ``conv_stem``, ``bn1``, ``blocks``, ``conv_head``, ``bn2``, pooling;
the offline EfficientNet-Lites and timm's EfficientNets with ``pretrained=true``, which sit
behind a :class:`~fedkit_core.models.inputs.PretrainedInput`), the frozen trunk is the input
adapter, the stem and the leading stages whose every parameter is frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedkit_core.models.fedmodel import FedModel

#: the stem of a timm EfficientNet, which the trunk must cover
STEM = ("conv_stem", "bn1")
#: where the network sits in the model (behind the backbone's input adapter)
NET = "backbone.net"


@dataclass(frozen=True)
class Trunk:
    """The frozen trunk of ``model``: its input adapter, stem and first ``stages`` stages."""

    model: FedModel
    stages: int

    @property
    def net(self) -> nn.Module:
        return self.model.backbone.net

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The trunk's output for a batch of (normalised) images."""
        net = self.net
        h = net.bn1(net.conv_stem(self.model.backbone.input(x)))
        for stage in net.blocks[: self.stages]:
            h = stage(h)
        return h

    def state(self) -> dict[str, torch.Tensor]:
        """The model's state entries the trunk's output depends on (its frozen weights
        and batch-norm statistics), as they are (not copies)."""
        names = [f"{NET}.{part}" for part in STEM]
        names += [f"{NET}.blocks.{k}" for k in range(self.stages)]
        return {
            key: value
            for key, value in self.model.state_dict(keep_vars=True).items()
            if any(key.startswith(name + ".") for name in names)
        }

    def attach(self) -> None:
        """Let the model's forward pass take the trunk's outputs in place of images."""
        self.model.backbone.cut = self.stages


def frozen_trunk(model: FedModel) -> Trunk | None:
    """The frozen trunk of ``model``, or None when it has none: a backbone other than an
    EfficientNet behind an input adapter, a stem that is not frozen, or an extra of the
    model that takes the images themselves (it needs them, not the trunk's output)."""
    backbone = model.backbone
    net = getattr(backbone, "net", None)
    if not hasattr(backbone, "cut") or type(net).__name__ != "EfficientNet":
        return None
    if model.extra_takes_images():
        return None

    def frozen(part: str) -> bool:
        params = [name for name, _ in net.get_submodule(part).named_parameters()]
        return bool(params) and all(model.is_frozen(f"{NET}.{part}.{p}") for p in params)

    if not all(frozen(part) for part in STEM):
        return None
    stages = 0
    while stages < len(net.blocks) and frozen(f"blocks.{stages}"):
        stages += 1
    return Trunk(model, stages)


def after_trunk(net: nn.Module, stages: int, h: torch.Tensor) -> torch.Tensor:
    """The EfficientNet ``net``'s output from its trunk's output ``h`` (the stages after
    the first ``stages``, the head convolution, pooling): what ``net(x)`` computes after
    the trunk, operation for operation."""
    for stage in net.blocks[stages:]:
        h = stage(h)
    return net.forward_head(net.bn2(net.conv_head(h)))
