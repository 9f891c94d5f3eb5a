"""Models: :class:`FedModel` and the builder behind the ``model`` config key (built-in names,
the offline ImageNet EfficientNet-Lites, timm, or a user factory ``module:factory``, see
:mod:`fedkit_core.models.user`)."""

from __future__ import annotations

from torch import nn

from fedkit_core.contract.data import SEGMENTATION, Normalizer, TaskInfo
from fedkit_core.extras import require
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.models.imagenet import LITE_MEAN, LITE_STD, build_lite, lite_name
from fedkit_core.models.inputs import MIN_SIZE, PretrainedBackbone, PretrainedInput
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

__all__ = [
    "FedModel",
    "CifarResNet",
    "SmallCNN",
    "build_backbone",
    "build_model",
    "build_user_model",
    "input_min_size",
    "input_statistics",
    "load_state_file",
    "load_weights",
]


def resolve_name(name: str, task: TaskInfo) -> str:
    if name == "auto":
        return "unet" if task.kind == SEGMENTATION else "cnn"
    return name


def input_statistics(name: str, pretrained: bool) -> tuple[tuple[float, ...], ...] | None:
    """``(mean, std)`` of the RGB input the backbone ``name`` expects, for a backbone that
    takes its pretraining's input (:class:`PretrainedInput`): the offline EfficientNet-Lites
    (pretrained or not, so that ``pretrained`` switches only the weights) and timm models
    with ``pretrained``; None for the others, which take the task's normalised images."""
    if lite_name(name):
        return LITE_MEAN, LITE_STD
    if not pretrained or name in ("auto", "cnn", "unet") or name in CIFAR_RESNETS:
        return None
    if is_user_model(name):
        return None
    timm = require("timm", f"model={name} (a timm model)")
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # an unknown name: the builder says so
        return None
    if cfg is None:
        return None
    return tuple(cfg.mean), tuple(cfg.std)


def input_min_size(name: str, pretrained: bool) -> int | None:
    """The smallest image side the backbone ``name`` takes (None: any)."""
    return MIN_SIZE if input_statistics(name, pretrained) is not None else None


def build_backbone(
    name: str,
    in_channels: int,
    pretrained: bool = False,
    normalizer: Normalizer | None = None,
    spatial_dims: int = 2,
) -> tuple[nn.Module, int]:
    """A classification backbone ``(module, feature_dim)``: cnn, a CIFAR resnet, an offline
    EfficientNet-Lite, or timm; for volumes (``spatial_dims=3``) only cnn, in 3D.

    Backbones with :func:`input_statistics` take 3-channel input behind a
    :class:`PretrainedInput` that undoes ``normalizer`` (the task's; None: images in
    [0, 1]) and applies their pretraining's normalisation.
    """
    if name == "cnn":
        net = SmallCNN(in_channels, spatial_dims=spatial_dims)
        return net, net.out_features
    if spatial_dims != 2:
        from fedkit_core.errors import FedkitError

        raise FedkitError(
            f"model={name} takes 2D images; for {spatial_dims}D volumes use model=cnn (a 3D "
            "CNN) or your own model (model=module:factory)"
        )
    if name in CIFAR_RESNETS:
        net = CifarResNet(CIFAR_RESNETS[name], in_channels)
        return net, net.out_features
    stats = input_statistics(name, pretrained)
    if stats is None:
        return timm_backbone(name, in_channels, pretrained)
    adapter = PretrainedInput(in_channels, normalizer, *stats, name=f"model={name}")
    if lite_name(name):
        net = build_lite(name, pretrained)
        dim = int(net.num_features)
    else:
        net, dim = timm_backbone(name, 3, pretrained)
    return PretrainedBackbone(net, adapter, dim), dim


def build_model(
    task: TaskInfo,
    name: str,
    pretrained: bool = False,
    weights: str | None = None,
    unet_channels: tuple[int, ...] = (16, 32, 64, 128),
    normalizer: Normalizer | None = None,
) -> FedModel:
    """The model for ``task``: backbone + linear head, a U-Net for segmentation, or the
    user factory ``name = "module:factory"``. ``normalizer``: the task's data normaliser,
    which a pretrained backbone's input undoes (see :func:`build_backbone`)."""
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
    backbone, dim = build_backbone(
        name, task.in_channels, pretrained, normalizer, task.spatial_dims
    )
    if isinstance(backbone, PretrainedBackbone):
        check_image_size(task, name, backbone.input.min_size)
    if weights:
        load_weights(getattr(backbone, "net", backbone), weights)
    return FedModel(backbone, nn.Linear(dim, task.num_classes), dim)


def check_image_size(task: TaskInfo, name: str, min_size: int) -> None:
    """Fail before training when the task's images are smaller than ``min_size``."""
    if task.image_shape and min(task.image_shape) < min_size:
        from fedkit_core.errors import FedkitError

        raise FedkitError(
            f"model={name} needs images of at least {min_size} px; the task's are "
            f"{'x'.join(map(str, task.image_shape))}: set task.image_size={min_size} (or more)"
        )
