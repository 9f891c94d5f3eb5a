"""User models (``model: module:factory``): the split into backbone and head, and user errors."""

import importlib
import sys
from pathlib import Path
from textwrap import dedent

import pytest
import torch
from torch import nn

import fedkit_core
from fedkit_core import FedkitError
from fedkit_core.contract.data import CLASSIFICATION, SEGMENTATION, TaskInfo
from fedkit_core.models import FedModel, build_model
from fedkit_core.testing import tiny

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "user_model"
TASK = TaskInfo("t", CLASSIFICATION, ["a", "b", "c"], in_channels=2, image_shape=(8, 8))

FACTORIES = """
import torch
from torch import nn
from fedkit_core import FedModel


def cnn(num_classes, in_channels):
    return nn.Sequential(
        nn.Conv2d(in_channels, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 6), nn.ReLU(),
        nn.Linear(6, num_classes),
    )


class Net(nn.Module):  # the head is registered first: not the last Linear in module order
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.fc = nn.Linear(5, num_classes)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 64, 5), nn.Tanh())

    def forward(self, x):
        return self.fc(self.body(x))


def fedmodel(num_classes, in_channels):
    return FedModel(nn.Flatten(), nn.Linear(in_channels * 64, num_classes), in_channels * 64)


def linear_then_more(num_classes, in_channels):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 64, num_classes), nn.Softmax(1))


def no_linear(num_classes, in_channels):
    return nn.Sequential(nn.Conv2d(in_channels, num_classes, 1), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten())


def wrong_shape(num_classes, in_channels):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 64, num_classes + 1))


def raises(num_classes, in_channels):
    raise RuntimeError("no GPU today")


def not_a_module(num_classes, in_channels):
    return "resnet"


def segmenter(num_classes, in_channels):
    return nn.Conv2d(in_channels, num_classes, 1)


answer = 42
"""


@pytest.fixture
def mymod(tmp_path, monkeypatch):
    (tmp_path / "mymod.py").write_text(dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mymod", raising=False)
    return tmp_path


def _reference(factory: str) -> tuple[nn.Module, torch.Tensor]:
    """The user's own module built from seed 0, and its eval logits on the next random batch."""
    import mymod

    torch.manual_seed(0)
    net = getattr(mymod, factory)(num_classes=3, in_channels=2).eval()
    with torch.no_grad():
        return net, net(torch.randn(5, 2, 8, 8))


@pytest.mark.parametrize("factory, feature_dim", [("cnn", 6), ("Net", 5)])
def test_plain_module_gives_the_same_logits_with_its_logits_linear_as_head(
    mymod, factory, feature_dim
):
    _, expected = _reference(factory)
    torch.manual_seed(0)
    model = build_model(TASK, f"mymod:{factory}")
    x = torch.randn(5, 2, 8, 8)  # the same batch: building drew nothing beyond the factory
    with torch.no_grad():
        out = model.eval()(x)
    assert isinstance(model.head, nn.Linear) and model.head.out_features == 3
    assert model.feature_dim == feature_dim == model.head.in_features
    assert out["features"].shape == (5, feature_dim)
    assert torch.allclose(out["logits"], expected, atol=1e-6)


def test_the_check_leaves_training_mode_and_batchnorm_statistics_alone(mymod):
    model = build_model(TASK, "mymod:cnn")
    assert model.training and int(model.backbone[1].num_batches_tracked) == 0


def test_fedmodel_factory_passes_through(mymod):
    model = build_model(TASK, "mymod:fedmodel")
    assert isinstance(model, FedModel) and model.feature_dim == 128
    assert isinstance(model.backbone, nn.Flatten)


def test_segmentation_module_is_the_backbone_without_head(mymod):
    task = TaskInfo("s", SEGMENTATION, ["bg", "fg"], in_channels=1, image_shape=(8, 8))
    model = build_model(task, "mymod:segmenter")
    assert isinstance(model.head, nn.Identity) and model.feature_dim is None
    assert model(torch.zeros(1, 1, 8, 8))["logits"].shape == (1, 2, 8, 8)


def test_model_weights_load_into_the_factory_module(mymod, tmp_path):
    net, _ = _reference("cnn")
    torch.save(net.state_dict(), tmp_path / "w.pt")
    model = build_model(TASK, "mymod:cnn", weights=str(tmp_path / "w.pt"))
    assert torch.equal(model.head.weight, net[-1].weight)


@pytest.mark.parametrize(
    "name, message",
    [
        ("nomod:make", "cannot import 'nomod', it is not on the Python path"),
        ("mymod:absent", "mymod has no attribute 'absent'"),
        ("mymod:answer", "answer is a int, not callable"),
        ("mymod:", "package.module:factory"),
        ("mymod:raises", "failed .*RuntimeError: no GPU today"),
        ("mymod:not_a_module", "returned str, not a torch nn.Module"),
        ("mymod:no_linear", "has no nn.Linear"),
        ("mymod:linear_then_more", "none of its nn.Linear layers computes its logits.*FedModel"),
        ("mymod:wrong_shape", r"must map images to \(N, 3\) logits.*gave \(2, 4\)"),
    ],
)
def test_user_errors_say_what_to_change(mymod, name, message):
    with pytest.raises(FedkitError, match=message):
        build_model(TASK, name)


def test_a_failing_import_inside_the_module_is_reported(mymod):
    (mymod / "broken.py").write_text("import not_installed_anywhere\n")
    importlib.invalidate_caches()
    with pytest.raises(FedkitError, match="importing broken failed.*not_installed_anywhere"):
        build_model(TASK, "broken:make")


def test_pretrained_is_refused_for_user_models(mymod):
    with pytest.raises(FedkitError, match="pretrained=true is for timm models"):
        build_model(TASK, "mymod:cnn", pretrained=True)


def test_a_federation_runs_a_user_model(mymod):
    results = fedkit_core.run(tiny(rounds=1, model="mymod:cnn"))
    assert results["config"]["model"] == "mymod:cnn"
    assert 0.0 <= results.final["global"]["bacc"] <= 1.0


def test_the_user_model_example_runs(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    config = fedkit_core.resolve_config(str(EXAMPLE / "config.yaml"))[0]
    assert config["model"] == "mymodel:make"
    results = fedkit_core.run([str(EXAMPLE / "config.yaml"), tiny(rounds=1)])
    assert "bacc" in results.final["global"]
