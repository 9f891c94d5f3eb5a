"""Layers are found and mapped to state entries by module name, on different networks."""

from __future__ import annotations

import pytest
import torch
from fedkit_fed_lwr.layers import DEFAULT_TYPES, assign, deepest_layer, find_layers, is_layer
from torch import nn

from fedkit_core.testing import unet

from .nets import ClassicUNet

LAYER_CLASSES = (nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm2d)


def expected_layers(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, LAYER_CLASSES)]


def test_is_layer_matches_class_families():
    assert is_layer(nn.Conv2d(1, 1, 1), ["Conv"])
    assert is_layer(nn.Conv3d(1, 1, 1), ["Conv"])
    assert not is_layer(nn.ConvTranspose2d(1, 1, 1), ["Conv"])
    assert is_layer(nn.ConvTranspose2d(1, 1, 1), ["ConvTranspose"])
    assert is_layer(nn.BatchNorm1d(2), ["BatchNorm"])
    assert is_layer(nn.SyncBatchNorm(2), ["SyncBatchNorm"])
    assert not is_layer(nn.Linear(2, 2), DEFAULT_TYPES)
    assert is_layer(nn.Linear(2, 2), ["Linear"])

    class MyConv(nn.Conv2d):
        pass

    assert is_layer(MyConv(1, 1, 1), ["Conv"])


def test_assign_uses_the_longest_dotted_prefix():
    layers = ["a.b", "a.b.c", "x"]
    keys = ["a.b.weight", "a.b.c.weight", "a.bc.weight", "x.running_mean", "y.weight", "a.weight"]
    assert assign(keys, layers) == {
        "a.b.weight": "a.b",
        "a.b.c.weight": "a.b.c",
        "a.bc.weight": None,  # "a.b" is a string prefix but not a module prefix
        "x.running_mean": "x",
        "y.weight": None,
        "a.weight": None,
    }


@pytest.mark.parametrize(
    "build",
    [
        lambda: unet(2, 1, 2, (4, 8, 16)),
        lambda: ClassicUNet(),
    ],
    ids=["monai-unet", "classic-unet"],
)
def test_unet_layers_cover_every_conv_bn_and_their_entries(build):
    model = build()
    layers = find_layers(model, DEFAULT_TYPES)
    assert layers == expected_layers(model)
    owner = assign(model.state_dict(), layers)
    for key, layer in owner.items():
        module_name = key.rsplit(".", 1)[0]
        module = dict(model.named_modules())[module_name]
        if isinstance(module, LAYER_CLASSES):
            assert layer == module_name, key
        else:
            assert layer is None, key  # e.g. MONAI's PReLU weights: averaged uniformly
    # batch-norm buffers belong to their layer, so they are re-weighted with it
    bn = next(n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d))
    assert {owner[f"{bn}.{b}"] for b in ("running_mean", "running_var", "num_batches_tracked")} == {
        bn
    }


def test_timm_classifier_layers_and_keep_filter():
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet10t", pretrained=False, num_classes=3, in_chans=1)
    layers = find_layers(model, DEFAULT_TYPES)
    assert layers == expected_layers(model)
    assert "fc" not in layers and find_layers(model, ["Linear"]) == ["fc"]
    # only layers owning a kept (shared) entry are measured
    kept = [k for k in model.state_dict() if not k.startswith("layer1.")]
    assert find_layers(model, DEFAULT_TYPES, keep=kept) == [
        n for n in layers if not n.startswith("layer1.")
    ]


def test_deepest_layer_is_the_end_of_the_encoder():
    model = ClassicUNet()
    layers = find_layers(model, DEFAULT_TYPES)
    assert deepest_layer(model, torch.randn(1, 1, 16, 16), layers) == "bottleneck.4"
    monai = unet(2, 1, 2, (4, 8, 16))
    name = deepest_layer(monai, torch.randn(1, 1, 16, 16), find_layers(monai, DEFAULT_TYPES))
    assert name == "model.1.submodule.1.submodule.conv.unit1.adn.N"  # last BN of the bottom
    assert model.training and monai.training  # the mode is restored
