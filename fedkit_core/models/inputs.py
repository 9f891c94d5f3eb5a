"""A pretrained network's input from a task's batch: grey to three channels, the task's
normalisation undone, the network's own applied.

Every batch a model or hook sees is normalised with the task's :class:`Normalizer`. A network
pretrained on ImageNet expects RGB images scaled as in its pretraining. :class:`PretrainedInput`
bridges the two inside the model (so every method and engine gets it, plugins calling
``model.backbone`` directly included). It undoes the task's normalisation as the frozen
priors of the ``fedkit-priors`` package do (:meth:`Normalizer.invert`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedkit_core.contract.data import Normalizer
from fedkit_core.errors import FedkitError
from fedkit_core.models.trunk import after_trunk

#: the smallest image side a pretrained backbone takes (EfficientNet and ResNet downsample
#: 32 times: below it the last stage sees a map smaller than one pixel per stride)
MIN_SIZE = 32


class PretrainedInput(nn.Module):
    """Maps a batch normalised by ``source`` (the task's normaliser; None: images in [0, 1])
    to a 3-channel batch normalised with ``mean``/``std`` (the pretraining's).

    Grey images are repeated on three channels. When ``source`` already is the network's
    normalisation (fedkit's default for pretrained backbones, see
    :func:`fedkit_core.tasks.loading.fixed_normalizer`), only the channels are repeated.
    ``min_size``: the smallest side accepted (a FedkitError below it). The statistics are
    non-persistent buffers: they follow the model to its device but are never sent or
    checkpointed (every party derives them from the config).
    """

    def __init__(
        self,
        in_channels: int,
        source: Normalizer | None,
        mean: Sequence[float],
        std: Sequence[float],
        min_size: int = MIN_SIZE,
        name: str = "the pretrained backbone",
    ):
        super().__init__()
        if in_channels not in (1, 3):
            raise FedkitError(f"{name} takes images with 1 or 3 channels, not {in_channels}")
        self.in_channels = in_channels
        self.min_size = min_size
        self.name = name
        if source is not None and (
            len(source.mean) != in_channels or len(source.std) != in_channels
        ):
            raise FedkitError(
                f"{name}: the task's normaliser has {len(source.mean)} channels, the images "
                f"{in_channels}"
            )
        self.source = source
        src = (source.mean, source.std) if source is not None else ((0.0,), (1.0,))
        wide = tuple(tuple(float(v) for v in s) * (3 // len(s)) for s in src)
        # nothing to rescale when the task's normalisation is the network's
        self.rescale = wide != (tuple(map(float, mean)), tuple(map(float, std)))
        self.register_buffer("mean", _channels(mean), persistent=False)
        self.register_buffer("std", _channels(std), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise FedkitError(
                f"{self.name} takes (N, {self.in_channels}, H, W) batches, got {tuple(x.shape)}"
            )
        if min(x.shape[-2:]) < self.min_size:
            raise FedkitError(
                f"{self.name} needs images of at least {self.min_size} px, got "
                f"{tuple(x.shape[-2:])}: set task.image_size={self.min_size} (or more)"
            )
        if self.rescale and self.source is not None:
            x = self.source.invert(x)  # per stored channel, before grey is repeated
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)
        if self.rescale:
            x = (x - self.mean) / self.std
        return x

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, rescale={self.rescale}"


class PretrainedBackbone(nn.Module):
    """``net(input(x))``: a pretrained feature extractor behind its :class:`PretrainedInput`.
    State entries are the network's under ``net.`` (``backbone.net.conv_stem.weight`` in a
    :class:`~fedkit_core.models.FedModel`).

    ``cut``: set by the frozen-trunk cache (:mod:`fedkit_core.models.trunk`) to the stages
    its cached outputs cover; the forward pass then also takes such outputs (a batch whose
    channels are not the images') and runs only the network after them. Images still run
    the whole network. Not state: every party sets it for itself.
    """

    def __init__(self, net: nn.Module, input: PretrainedInput, out_features: int):
        super().__init__()
        self.input = input
        self.net = net
        self.out_features = out_features
        self.cut: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cut is not None and x.shape[1] != self.input.in_channels:
            return after_trunk(self.net, self.cut, x)
        return self.net(self.input(x))


def _channels(values: Sequence[float]) -> torch.Tensor:
    return torch.tensor([float(v) for v in values]).view(1, -1, 1, 1)
