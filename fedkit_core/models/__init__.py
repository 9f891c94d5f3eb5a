"""Models: :class:`FedModel` and the builder behind the ``model`` config key (built-in names,
timm, or a user factory ``module:factory``, see :mod:`fedkit_core.models.user`)."""

from __future__ import annotations

from torch import nn

from fedkit_core.models.fedmodel import FedModel
from fedkit_core.models.networks import (
    CIFAR_RESNETS,
    CifarResNet,
    SmallCNN,
    load_state_file,
    load_weights,
    timm_backbone,
    unet,
)
from fedkit_core.models.user import build_user_model, is_user_model
from fedkit_core.tasks.base import SEGMENTATION, TaskInfo

__all__ = [
    "FedModel",
    "CifarResNet",
    "SmallCNN",
    "build_backbone",
    "build_model",
    "build_user_model",
    "load_state_file",
    "load_weights",
]


def resolve_name(name: str, task: TaskInfo) -> str:
    if name == "auto":
        return "unet" if task.kind == SEGMENTATION else "cnn"
    return name


def build_backbone(name: str, in_channels: int, pretrained: bool = False) -> tuple[nn.Module, int]:
    """A classification backbone ``(module, feature_dim)``: cnn, a CIFAR resnet, or timm."""
    if name == "cnn":
        net = SmallCNN(in_channels)
        return net, net.out_features
    if name in CIFAR_RESNETS:
        net = CifarResNet(CIFAR_RESNETS[name], in_channels)
        return net, net.out_features
    return timm_backbone(name, in_channels, pretrained)


def build_model(
    task: TaskInfo,
    name: str,
    pretrained: bool = False,
    weights: str | None = None,
    unet_channels: tuple[int, ...] = (16, 32, 64, 128),
) -> FedModel:
    """The model for ``task``: backbone + linear head, a U-Net for segmentation, or the
    user factory ``name = "module:factory"``."""
    name = resolve_name(name, task)
    if is_user_model(name):
        return build_user_model(task, name, pretrained, weights)
    if task.kind == SEGMENTATION:
        if name != "unet":
            from fedkit_core.errors import FedkitError

            raise FedkitError(
                f"segmentation tasks need model=unet (or a plugin's model), not {name!r}"
            )
        net = unet(task.spatial_dims, task.in_channels, task.num_classes, unet_channels)
        if weights:
            load_weights(net, weights)
        return FedModel(net, nn.Identity(), None)
    if name == "unet":
        from fedkit_core.errors import FedkitError

        raise FedkitError(f"model=unet is for segmentation; task {task.name!r} is classification")
    backbone, dim = build_backbone(name, task.in_channels, pretrained)
    if weights:
        load_weights(backbone, weights)
    return FedModel(backbone, nn.Linear(dim, task.num_classes), dim)
