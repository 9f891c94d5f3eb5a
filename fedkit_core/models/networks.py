"""Backbones: a small CPU-friendly CNN, CIFAR-style ResNets, timm models and MONAI U-Nets.

Each builder returns ``(backbone, feature_dim)``: the backbone maps (N, C, H, W) images to
(N, feature_dim) features (segmentation networks map to per-pixel logits, feature_dim None).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core.errors import FedkitError
from fedkit_core.extras import require


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU stages and global average pooling: the default classifier backbone,
    for 2D images or (``spatial_dims=3``) volumes (N, C, D, H, W)."""

    def __init__(self, in_channels: int, width: int = 32, spatial_dims: int = 2):
        super().__init__()
        if spatial_dims not in (2, 3):
            raise FedkitError(f"model=cnn takes 2D images or 3D volumes, not {spatial_dims}D")
        conv, norm, pool, gap = (
            (nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d)
            if spatial_dims == 2
            else (nn.Conv3d, nn.BatchNorm3d, nn.MaxPool3d, nn.AdaptiveAvgPool3d)
        )

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(conv(cin, cout, 3, padding=1, bias=False), norm(cout), nn.ReLU())

        self.features = nn.Sequential(
            block(in_channels, width),
            pool(2),
            block(width, 2 * width),
            pool(2),
            block(2 * width, 4 * width),
            gap(1),
            nn.Flatten(),
        )
        self.out_features = 4 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class _BasicBlock(nn.Module):
    """The CIFAR ResNet block with option-A (zero-padded identity) shortcuts."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin if stride != 1 or cin != cout else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.pad:
            shortcut = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad // 2, self.pad // 2))
        return F.relu(out + shortcut)


class CifarResNet(nn.Module):
    """ResNet-20/32/44/56/110 for small images (He et al. 2016, CIFAR variant).

    State-dict names match the widely used CIFAR checkpoints (``conv1``, ``bn1``,
    ``layer1..3``, ``linear``), so :func:`load_cifar_resnet` loads them directly.
    """

    def __init__(self, depth: int, in_channels: int = 3, num_classes: int = 0):
        super().__init__()
        if (depth - 2) % 6:
            raise FedkitError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(_BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.linear = nn.Linear(64, num_classes) if num_classes else nn.Identity()
        self.out_features = 64

    def features(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(x))


CIFAR_RESNETS = {"resnet20": 20, "resnet32": 32, "resnet44": 44, "resnet56": 56, "resnet110": 110}


def load_state_file(path: str) -> dict[str, torch.Tensor]:
    """A state dict from a checkpoint file: plain, under ``state_dict``/``model``, with
    any ``module.`` prefix (DataParallel) removed."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FedkitError(f"weights file not found: {path}") from None
    except Exception as err:
        raise FedkitError(f"cannot read weights file {path}: {err}") from None
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(blob, dict) and isinstance(blob.get(key), dict):
            blob = blob[key]
    if not isinstance(blob, dict):
        raise FedkitError(f"{path} holds no state dict")
    return {k.removeprefix("module."): v for k, v in blob.items() if isinstance(v, torch.Tensor)}


def load_weights(module: nn.Module, path: str, *, strict: bool = False) -> None:
    """Load matching entries of a checkpoint into ``module``; fail if nothing matches.

    ``strict`` also fails when an entry of the model is absent from the file, except
    BatchNorm's ``num_batches_tracked`` counters, which many published checkpoints omit.
    """
    state = load_state_file(path)
    own = module.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    required = [k for k in own if not k.endswith("num_batches_tracked")]
    if not usable or (strict and any(k not in usable for k in required)):
        raise FedkitError(
            f"{path} does not fit the model: {len(usable)} of {len(own)} entries match by name and shape"
        )
    module.load_state_dict(usable, strict=False)


def timm_backbone(name: str, in_channels: int, pretrained: bool) -> tuple[nn.Module, int]:
    """The timm model ``name`` without its classifier, and its feature size."""
    timm = require("timm", f"model={name} (not cnn, unet, resnet20..110: a timm model)")

    if name not in timm.list_models() and not timm.is_model(name):
        raise FedkitError(f"unknown model {name!r}: not cnn, unet, a CIFAR resnet or a timm model")
    try:
        model = timm.create_model(name, pretrained=pretrained, num_classes=0, in_chans=in_channels)
    except Exception as err:
        raise FedkitError(
            f"timm could not build {name!r} (pretrained={pretrained}): {err}"
        ) from None
    return model, int(model.num_features)


def unet(
    spatial_dims: int, in_channels: int, num_classes: int, channels: tuple[int, ...]
) -> nn.Module:
    """A MONAI U-Net with batch norm (the U-Nets of the segmentation papers use BN)."""
    require("monai", "model=unet (segmentation)")
    from monai.networks.nets import UNet

    return UNet(
        spatial_dims=spatial_dims,
        in_channels=in_channels,
        out_channels=num_classes,
        channels=channels,
        strides=(2,) * (len(channels) - 1),
        num_res_units=2,
        norm="batch",
    )
