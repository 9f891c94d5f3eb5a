"""Your own model: ``model: "package.module:factory"``.

Beside the built-in names and timm, the ``model`` key accepts ``module:factory``. fedkit
imports ``module`` from the Python path (run from its folder with ``PYTHONPATH=.``, or
install it; every process of a run, Flower's included, must be able to import it) and calls
``factory(num_classes=..., in_channels=...)``. The factory returns either

* a plain ``nn.Module`` mapping an image batch to (N, num_classes) logits: fedkit takes the
  ``nn.Linear`` that computes the logits as the head (the last in module order that, split
  off, gives the same logits on a random batch) and the module with that Linear replaced by
  ``nn.Identity`` as the backbone, so that plugins working on features and heads (FCA,
  Fed-MAS, ...) see the Linear's input as the features and ``feature_dim`` is its
  ``in_features``. For segmentation, a module mapping images to per-pixel logits is the backbone
  as a whole, with no head (as the built-in U-Net is); or
* a :class:`~fedkit_core.models.FedModel`, used as it is: needed when no Linear computes the
  logits (a classifier followed by more layers, rescaled logits...).

``model_weights`` loads a checkpoint of what the factory returns (its own state names).

Example (``examples/user_model/``)::

    # mymodel.py
    def make(num_classes: int, in_channels: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(in_channels, 16, 3), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))

    # PYTHONPATH=. fedkit run --set model=mymodel:make
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedkit_core.contract.data import SEGMENTATION, TaskInfo
from fedkit_core.errors import FedkitError
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.models.networks import load_weights


def is_user_model(name: str) -> bool:
    """Whether ``name`` refers to a user factory (``module:factory``) rather than a built-in."""
    return ":" in name


def build_user_model(
    task: TaskInfo, name: str, pretrained: bool = False, weights: str | None = None
) -> FedModel:
    """The FedModel of the factory ``name`` for ``task``, with ``weights`` loaded if given."""
    if pretrained:
        raise FedkitError(
            f"pretrained=true is for timm models; the factory of model {name} loads its own "
            "weights (or set model_weights to a checkpoint of its module)"
        )
    net = _call_factory(name, task)
    if weights:
        load_weights(net, weights)
    if isinstance(net, FedModel):
        return net
    if task.kind == SEGMENTATION:
        return FedModel(net, nn.Identity(), None)
    return _split_head(net, task, name)


def _call_factory(name: str, task: TaskInfo) -> nn.Module:
    factory = load_factory(name)
    try:
        net = factory(num_classes=task.num_classes, in_channels=task.in_channels)
    except Exception as err:
        raise FedkitError(
            f"model factory {name} failed (called with num_classes={task.num_classes}, "
            f"in_channels={task.in_channels}): {type(err).__name__}: {err}"
        ) from err
    if not isinstance(net, nn.Module):
        raise FedkitError(
            f"model factory {name} returned {type(net).__name__}, not a torch nn.Module "
            "or a fedkit FedModel"
        )
    return net


def load_factory(name: str) -> Callable[..., object]:
    """The callable named by ``module:attribute`` (the attribute may be dotted)."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise FedkitError(f"model {name!r}: a user model is written package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name + ".").startswith(err.name + "."):
            raise FedkitError(
                f"model {name!r}: cannot import {module_name!r}, it is not on the Python path "
                "(add its folder to PYTHONPATH or install it)"
            ) from None
        raise FedkitError(f"model {name!r}: importing {module_name} failed: {err}") from err
    except Exception as err:
        raise FedkitError(
            f"model {name!r}: importing {module_name} failed: {type(err).__name__}: {err}"
        ) from err
    target: object = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise FedkitError(f"model {name!r}: {module_name} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise FedkitError(f"model {name!r}: {attribute} is a {type(target).__name__}, not callable")
    return target


def _split_head(net: nn.Module, task: TaskInfo, name: str) -> FedModel:
    """A FedModel of a plain classifier whose head is the Linear computing its logits: the
    last Linear in module order that, split off, gives the same logits on a random batch."""
    linears = [(path, m) for path, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise FedkitError(
            f"model {name}: the module has no nn.Linear to serve as the classification head; "
            "return a fedkit FedModel(backbone, head, feature_dim) instead"
        )
    # a fixed generator: the check must not move the run's seeded random stream
    batch = torch.randn(2, task.in_channels, *task.image_shape, generator=torch.Generator())
    try:
        expected = _eval_forward(net, batch)
    except Exception as err:
        raise FedkitError(
            f"model {name} fails on a batch of shape {tuple(batch.shape)}: "
            f"{type(err).__name__}: {err}"
        ) from err
    if not isinstance(expected, torch.Tensor) or expected.shape != (2, task.num_classes):
        got = tuple(expected.shape) if isinstance(expected, torch.Tensor) else type(expected)
        raise FedkitError(
            f"model {name} must map images to (N, {task.num_classes}) logits; "
            f"a batch of shape {tuple(batch.shape)} gave {got}"
        )
    for path, head in reversed(linears):
        model = _try_head(net, path, head, batch, expected)
        if model is not None:
            return model
    raise FedkitError(
        f"model {name}: none of its nn.Linear layers computes its logits (is the classifier "
        "followed by more layers?), so fedkit cannot split it into backbone and head; return "
        "a fedkit FedModel(backbone, head, feature_dim) instead"
    )


def _try_head(
    net: nn.Module, path: str, head: nn.Linear, batch: torch.Tensor, expected: torch.Tensor
) -> FedModel | None:
    """``net`` split at the Linear ``path`` if that gives the same logits, else None (and
    ``net`` unchanged). The backbone is ``net`` with the Linear replaced by Identity."""
    if not path:
        return FedModel(nn.Identity(), head, head.in_features)
    parent_path, _, child = path.rpartition(".")
    parent = net.get_submodule(parent_path)
    setattr(parent, child, nn.Identity())
    model = FedModel(net, head, head.in_features)
    try:
        same = torch.allclose(_eval_forward(model, batch)["logits"], expected, rtol=1e-4, atol=1e-5)
    except Exception:
        same = False
    if same:
        return model
    setattr(parent, child, head)
    return None


def _eval_forward(net: nn.Module, batch: torch.Tensor) -> Any:
    """``net(batch)`` in eval mode without gradients (BatchNorm statistics untouched)."""
    mode = net.training
    net.eval()
    try:
        with torch.no_grad():
            return net(batch)
    finally:
        net.train(mode)
