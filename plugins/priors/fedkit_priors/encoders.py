"""Frozen pretrained encoders: knowledge a plugin uses on every client but never trains or sends.

Fed-MAS distils towards a self-supervised image encoder, FedHelp queries a foundation model,
FedCB uses a frozen text tower. Each needs a pretrained network that is the same everywhere,
built once from local files, always in eval mode, with no gradients, outside the model that is
trained and aggregated. :func:`frozen_encoder` builds such an image encoder from a *source*:

======================== =================================================================
source                   network, and the feature it returns
======================== =================================================================
``cifar-resnet20`` ..110 fedkit's CIFAR ResNet (option-A shortcuts): 64-d pooled feature, 32 px
``efficientnet_lite0``..2 EfficientNet-Lite (timm's ``tf_efficientnet_lite*``): 1280-d pooled
                         feature; ``weights="imagenet"``: the offline ImageNet weights of the
                         ``fedkit[pretrained]`` extra (the core's ``LITE`` models)
``timm:<name>``          a timm model built with ``num_classes=0``: its pooled feature
``torchvision:<name>``   a torchvision classifier with its last layer (``fc``, ``classifier``,
                         ``heads`` or ``head``) removed: e.g. 2048-d for ``resnet50``
``open_clip:<name>``     the image tower of an open_clip model: its image embedding
======================== =================================================================

``weights`` is a checkpoint file, ``imagenet`` (the EfficientNet-Lites' offline weights), an
``http(s)://`` URL (downloaded once into torch's hub
cache; needs the internet) or, for open_clip, a pretrained tag; ``None`` builds the
architecture with random weights, which is only meaningful in tests. Checkpoints may wrap
the network (``module.``, ``encoder_q.``, ``backbone.`` ... prefixes are found automatically;
MoCo's ``encoder_q`` comes first in its files) and may hold extra entries (a MoCo projection
head, a classifier): every entry of the encoder must be found, the rest is ignored.

Input: :meth:`FrozenEncoder.forward` takes images scaled to [0, 1] (N, 1 or 3, H, W), repeats
a grey channel, resizes to the encoder's input size and applies the encoder's own
normalisation. Hooks see batches normalised with the task's statistics; pass those through
:meth:`FrozenEncoder.encode` with the client's normaliser, which undoes the task's
normalisation first, so the encoder sees the same (augmented) images as the local model.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core import (
    CIFAR_RESNETS,
    LITE,
    LITE_MEAN,
    LITE_STD,
    CifarResNet,
    FedkitError,
    build_lite,
    load_state_file,
    require,
    to_timm,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
KINDS = ("cifar", "timm", "torchvision", "open_clip", "lite")
SOURCES_HELP = (
    "cifar-resnet20..110, efficientnet_lite0..2, timm:<name>, torchvision:<name> or "
    "open_clip:<name>"
)
#: ``weights`` naming the offline ImageNet weights of an EfficientNet-Lite source
IMAGENET = "imagenet"
_HEAD_NAMES = ("fc", "classifier", "heads", "head")


class Normalizer(Protocol):
    """A task's normaliser as hooks get it (``client.normalizer``): what it can undo."""

    def invert(self, x: torch.Tensor) -> torch.Tensor: ...


class FrozenEncoder(nn.Module):
    """A pretrained network that stays in eval mode with ``requires_grad=False``.

    ``feature_dim``: size of the returned feature; ``image_size``: the side images are
    resized to; ``mean``/``std``: the encoder's own input normalisation.
    """

    def __init__(
        self,
        net: nn.Module,
        feature_dim: int,
        image_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        source: str = "",
    ):
        super().__init__()
        self.net = net
        self.feature_dim = int(feature_dim)
        self.image_size = int(image_size)
        self.source = source
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> FrozenEncoder:
        """Always eval: batch-norm statistics and dropout of a prior never change."""
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Features (N, feature_dim) of images scaled to [0, 1], shape (N, 1 or 3, H, W)."""
        if images.dim() != 4 or images.shape[1] not in (1, 3):
            raise FedkitError(
                f"the prior {self.source!r} takes 2D images with 1 or 3 channels, got shape "
                f"{tuple(images.shape)}"
            )
        x = images.float()
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            shrink = min(x.shape[-2:]) > self.image_size
            x = F.interpolate(
                x,
                size=(self.image_size, self.image_size),
                mode="bilinear",
                antialias=shrink,
                align_corners=False,
            )
        out = self.net((x - self.mean) / self.std)
        if out.dim() > 2:
            out = out.flatten(2).mean(-1)
        return out.float()

    def encode(self, x: torch.Tensor, normalizer: Normalizer) -> torch.Tensor:
        """Features of a batch normalised with the task's ``normalizer`` (what hooks see)."""
        return self(unnormalize(x, normalizer))

    def extra_repr(self) -> str:
        return (
            f"source={self.source!r}, feature_dim={self.feature_dim}, image_size={self.image_size}"
        )


def unnormalize(x: torch.Tensor, normalizer: Normalizer) -> torch.Tensor:
    """Undo the task's normalisation: back to images scaled to [0, 1] (uint8 data) or to
    the stored scale (float data)."""
    return normalizer.invert(x)


def parse_source(source: str) -> tuple[str, str]:
    """``(kind, name)`` of an encoder source, or a FedkitError listing the valid forms."""
    match = re.fullmatch(r"cifar-(resnet\d+)", source)
    if match and match.group(1) in CIFAR_RESNETS:
        return "cifar", match.group(1)
    if source in LITE:
        return "lite", source
    kind, sep, name = source.partition(":")
    if not sep or kind not in KINDS[1:-1] or not name:
        raise FedkitError(f"unknown prior source {source!r}: use {SOURCES_HELP}")
    return kind, name


def check_source(source: str) -> None:
    """Fail early (before any data moves) when ``source`` names no known architecture."""
    kind, name = parse_source(source)
    if kind == "timm":
        known = require("timm", f"prior {source}").is_model(name)
    elif kind == "torchvision":
        import torchvision

        known = name in torchvision.models.list_models(module=torchvision.models)
    elif kind == "open_clip":
        open_clip = require("open_clip", f"prior {source}")
        known = name in open_clip.list_models() or name.startswith("hf-hub:")
    else:
        known = True
    if not known:
        raise FedkitError(f"prior source {source!r}: {kind} has no model named {name!r}")


def frozen_encoder(
    source: str,
    weights: str | None = None,
    *,
    image_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    prefix: str | None = None,
) -> FrozenEncoder:
    """Build a frozen encoder from ``source`` and ``weights`` (see the module docstring).

    ``image_size``, ``mean``, ``std`` override the encoder's input defaults (the
    pretraining's: ImageNet statistics at 224 px for torchvision, timm's pretrained config,
    open_clip's preprocessing, 32 px for the CIFAR ResNets). ``prefix``: the key prefix of
    the encoder inside the checkpoint (default: found automatically).
    """
    kind, name = parse_source(source)
    check_source(source)
    if kind == "open_clip":
        net, size, defaults = _open_clip_tower(name, weights)
    elif kind == "lite" and weights == IMAGENET:
        net, size, defaults = (
            build_lite(name, pretrained=True),
            LITE[name].size,
            (LITE_MEAN, LITE_STD),
        )
    else:
        net, size, defaults = _build(kind, name)
        if weights == IMAGENET:
            raise FedkitError(
                f"prior {source!r}: weights={IMAGENET!r} are offline only for "
                f"{', '.join(LITE)}; give a checkpoint path"
            )
        if weights is not None:
            state = _read_weights(weights)
            if kind == "lite" and any(k.startswith("_blocks.") for k in state):
                state = to_timm(state, net, weights)  # lukemelas names, as packaged
            load_matching(net, state, weights, prefix)
    mean, std = mean or defaults[0], std or defaults[1]
    size = image_size or size
    return FrozenEncoder(net, _probe_dim(net, size), size, mean, std, source)


@functools.lru_cache(maxsize=32)
def encoder_feature_dim(source: str, image_size: int | None = None) -> int:
    """The feature size of ``source`` without loading weights (cheap: meta tensors)."""
    kind, name = parse_source(source)
    check_source(source)
    if kind == "open_clip":
        config = require("open_clip", source).get_model_config(name)
        if config and "embed_dim" in config:
            return int(config["embed_dim"])
        return frozen_encoder(source).feature_dim
    with torch.device("meta"):
        net, size, _ = _build(kind, name)
        return _probe_dim(net, image_size or size)


def build_encoder(
    source: str,
) -> tuple[nn.Module, int, tuple[Sequence[float], Sequence[float]]]:
    """A trainable encoder of ``source`` with random weights, its input side and its input
    normalisation: what ``fedkit prior pretrain`` trains and :func:`frozen_encoder` loads.
    open_clip towers are not offered (they are pretrained with text, not from images alone)."""
    kind, name = parse_source(source)
    check_source(source)
    if kind == "open_clip":
        raise FedkitError(
            f"{source}: open_clip towers cannot be pre-trained here; use cifar-resnet20..110, "
            "timm:<name> or torchvision:<name>"
        )
    return _build(kind, name)


def _build(kind: str, name: str) -> tuple[nn.Module, int, tuple[Sequence[float], Sequence[float]]]:
    """The architecture (random weights), its input side and its normalisation."""
    if kind == "cifar":
        # the CIFAR checkpoints were trained on ImageNet-normalised 32 px images
        return CifarResNet(CIFAR_RESNETS[name]), 32, (IMAGENET_MEAN, IMAGENET_STD)
    if kind == "lite":
        return build_lite(name, pretrained=False), LITE[name].size, (LITE_MEAN, LITE_STD)
    if kind == "timm":
        timm = require("timm", f"timm:{name}")
        net = timm.create_model(name, pretrained=False, num_classes=0)
        cfg = getattr(net, "pretrained_cfg", {}) or {}
        size = int(cfg.get("input_size", (3, 224, 224))[-1])
        return (
            net,
            size,
            (cfg.get("mean", IMAGENET_MEAN), cfg.get("std", IMAGENET_STD)),
        )
    import torchvision

    net = torchvision.models.get_model(name, weights=None)
    for attr in _HEAD_NAMES:
        if isinstance(getattr(net, attr, None), nn.Module):
            setattr(net, attr, nn.Identity())
            break
    else:
        raise FedkitError(
            f"torchvision:{name}: no last layer named {', '.join(_HEAD_NAMES)} to remove"
        )
    return net, 224, (IMAGENET_MEAN, IMAGENET_STD)


def open_clip_model(name: str, weights: str | None) -> nn.Module:
    """An open_clip model (image and text towers) on the CPU, with a clear error when the
    weights cannot be had (offline: pass the path of a downloaded checkpoint)."""
    open_clip = require("open_clip", f"open_clip:{name}")
    try:
        return open_clip.create_model(name, pretrained=weights, device="cpu")
    except Exception as err:
        raise FedkitError(
            f"open_clip could not build {name!r} with pretrained={weights!r}: {err}. Offline, "
            "pass the path of a downloaded open_clip checkpoint"
        ) from None


def open_clip_preprocess(tower: nn.Module) -> tuple[int, tuple[Sequence[float], Sequence[float]]]:
    """The image size and (mean, std) an open_clip image tower expects."""
    open_clip = require("open_clip", "an open_clip image tower")
    cfg = getattr(tower, "preprocess_cfg", {}) or {}
    size = tower.image_size
    size = int(size[0] if isinstance(size, (tuple, list)) else size)
    mean = cfg.get("mean", open_clip.OPENAI_DATASET_MEAN)
    std = cfg.get("std", open_clip.OPENAI_DATASET_STD)
    return size, (mean, std)


def _open_clip_tower(
    name: str, weights: str | None
) -> tuple[nn.Module, int, tuple[Sequence[float], Sequence[float]]]:
    tower = open_clip_model(name, weights).visual
    size, norm = open_clip_preprocess(tower)
    return tower, size, norm


def _probe_dim(net: nn.Module, size: int) -> int:
    """The feature size, from one forward pass on a dummy image (no_grad, eval)."""
    device = next((p.device for p in net.parameters()), torch.device("cpu"))
    was_training = net.training
    net.eval()
    with torch.no_grad():
        out = net(torch.zeros(1, 3, size, size, device=device))
    net.train(was_training)
    return int(out.shape[1])


def _read_weights(weights: str) -> dict[str, torch.Tensor]:
    if urlparse(weights).scheme in ("http", "https"):
        weights = _download(weights)
    return load_state_file(weights)


def _download(url: str) -> str:
    """The local copy of ``url`` in torch's hub cache, downloaded on first use."""
    target = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(url, str(target), progress=False)
        except Exception as err:
            raise FedkitError(
                f"cannot download the prior's weights from {url} ({err}). Without internet "
                "access, download the file elsewhere and give its local path instead"
            ) from None
    return str(target)


def load_matching(
    net: nn.Module,
    state: Mapping[str, torch.Tensor],
    origin: str = "checkpoint",
    prefix: str | None = None,
) -> str:
    """Load every entry of ``net`` from ``state``, whose keys may carry a prefix; return it.

    All of ``net``'s entries (batch-norm ``num_batches_tracked`` counters excepted) must be
    found with the right shapes; entries of ``state`` outside ``net`` are ignored.
    """
    own = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    if prefix is None:
        prefix = _best_prefix(state, own)
    picked = {
        key[len(prefix) :]: value
        for key, value in state.items()
        if key.startswith(prefix) and key[len(prefix) :] in own
    }
    missing = [k for k in own if k not in picked]
    wrong = [k for k in picked if tuple(picked[k].shape) != tuple(own[k].shape)]
    if missing or wrong:
        raise FedkitError(
            f"{origin} does not hold this encoder (key prefix {prefix!r}): "
            f"{len(missing)} of {len(own)} entries missing {missing[:3]}, "
            f"{len(wrong)} with another shape {wrong[:3]}"
        )
    net.load_state_dict(picked, strict=False)
    return prefix


def _best_prefix(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> str:
    """The key prefix under which most of ``own`` is found (first in checkpoint order on ties)."""
    candidates: dict[str, None] = {"": None}
    for key in state:
        parts = key.split(".")
        for depth in range(1, min(3, len(parts))):
            candidates[".".join(parts[:depth]) + "."] = None
    best, best_hits = "", -1
    for prefix in candidates:
        hits = sum(1 for k in state if k.startswith(prefix) and k[len(prefix) :] in own)
        if hits > best_hits:
            best, best_hits = prefix, hits
    return best
