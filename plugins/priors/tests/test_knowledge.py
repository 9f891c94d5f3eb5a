"""`fedkit knowledge build`: foundation-model answers on public data, built once, read back."""

import numpy as np
import pytest
import torch
from fedkit_priors.knowledge import (
    Knowledge,
    PublicSet,
    api_agreement,
    build_knowledge,
    fit_images,
    load_knowledge,
    load_public,
)

from fedkit_core.plugin import FedkitError
from fedkit_core.testing import fedkit_command as main
from fedkit_core.testing import shared_data

WEIGHTS = "weights/cifar10_resnet"


def test_offline_cifar_apis_give_probabilities_on_real_public_images(tmp_path):
    breast = shared_data("medmnist", "breastmnist.npz")
    folder = shared_data(*WEIGHTS.split("/"))
    apis = [f"cifar-resnet20@{folder / 'resnet20-12fca82f.th'}"]
    apis.append(f"cifar-resnet32@{folder / 'resnet32-d509ac18.th'}")
    public = load_public(str(breast), limit=24)
    assert public.images.shape == (24, 28, 28, 1) and public.images.dtype == np.uint8
    k = build_knowledge(public, apis)
    assert k.probs.shape == (24, 2, 10) and np.allclose(k.probs.sum(2), 1, atol=1e-5)
    assert not np.allclose(k.probs[:, 0], k.probs[:, 1])  # two different networks
    assert (k.labels == -1).all()  # CIFAR-10 classes are not the public set's classes
    assert k.classes[0] == "airplane"


def test_cli_builds_a_file_from_precomputed_answers_and_reads_it_back(tmp_path, capsys):
    breast = shared_data("medmnist", "breastmnist.npz")
    probs = np.random.default_rng(0).dirichlet(np.ones(2), size=10)
    classes = load_public(str(breast), limit=1).classes
    np.savez(tmp_path / "api.npz", probs=probs, classes=np.array(classes))
    out = tmp_path / "k.npz"
    args = ["knowledge", "build", "--public", str(breast), "--limit", "10"]
    assert main([*args, "--api", f"precomputed:{tmp_path / 'api.npz'}", "--out", str(out)]) == 0
    k = load_knowledge(out)
    assert np.allclose(k.probs[:, 0], probs) and k.apis == [f"precomputed:{tmp_path / 'api.npz'}"]
    assert (k.labels >= 0).all()  # same class names: the public labels are kept
    assert main([*args, "--api", "nothing:here", "--out", str(out)]) == 2
    assert "unknown API" in capsys.readouterr().err


def test_bad_inputs_are_readable_errors(tmp_path):
    public = PublicSet(np.zeros((3, 8, 8, 1), np.uint8), np.zeros(3, np.int64), ["a", "b"])
    with pytest.raises(FedkitError, match="needs its checkpoint"):
        build_knowledge(public, ["cifar-resnet20"])
    with pytest.raises(FedkitError, match="does not exist"):
        load_knowledge(tmp_path / "missing.npz")
    with pytest.raises(FedkitError, match="open_clip has no model|open_clip could not"):
        build_knowledge(public, [f"open_clip:RN50@{tmp_path / 'none.pt'}"])


def test_fit_images_resizes_and_converts_channels():
    grey = np.full((2, 28, 28, 1), 100, np.uint8)
    rgb = fit_images(grey, (32, 32), 3)
    assert rgb.shape == (2, 3, 32, 32) and rgb.dtype == torch.uint8 and (rgb == 100).all()
    colour = np.zeros((1, 10, 10, 3), np.uint8)
    colour[..., 0] = 200
    back = fit_images(colour, (5, 5), 1)
    assert back.shape == (1, 1, 5, 5) and int(back[0, 0, 0, 0]) == round(0.299 * 200)


def test_torchvision_api_with_a_local_checkpoint(tmp_path):
    import torchvision

    public = PublicSet(np.full((3, 16, 16, 1), 120, np.uint8), np.zeros(3, np.int64), ["a", "b"])
    specs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        net = torchvision.models.get_model("mobilenet_v3_small", weights=None, num_classes=3)
        net.classifier[-1].bias.data = torch.randn(3)  # distinct answers per checkpoint
        torch.save(net.state_dict(), tmp_path / f"net{seed}.pt")
        specs.append(f"torchvision:mobilenet_v3_small@{tmp_path / f'net{seed}.pt'}")
    k = build_knowledge(public, specs)
    assert k.probs.shape == (3, 2, 3) and np.allclose(k.probs.sum(2), 1, atol=1e-5)
    assert not np.allclose(k.probs[:, 0], k.probs[:, 1])  # each checkpoint was loaded


# --------------------------------------------------------------------------- probe APIs


def bright_or_dark(n: int, seed: int, flip: bool = False) -> PublicSet:
    """Grey 16 px images, class 1 bright and class 0 dark (``flip``: labelled the other way)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    images = 40 + 150 * labels[:, None, None, None] + rng.integers(0, 40, (n, 16, 16, 1))
    return PublicSet(images.astype(np.uint8), (labels ^ flip).astype(np.int64), ["dark", "bright"])


def test_probe_api_learns_the_public_classes_from_the_held_out_split_only():
    resnet = shared_data(*WEIGHTS.split("/"), "resnet20-12fca82f.th")
    public = bright_or_dark(24, seed=0)
    public.probe = bright_or_dark(20, seed=1)
    k = build_knowledge(public, [f"probe:cifar-resnet20@{resnet}"])
    assert k.probs.shape == (24, 1, 2) and np.allclose(k.probs.sum(2), 1, atol=1e-5)
    assert k.classes == ["dark", "bright"] and (k.labels == public.labels).all()  # kept
    assert api_agreement(k)[f"probe:cifar-resnet20@{resnet} acc"] == 1.0
    public.probe = bright_or_dark(20, seed=1, flip=True)  # the probe split alone teaches it
    flipped = build_knowledge(public, [f"probe:cifar-resnet20@{resnet}"])
    assert (flipped.probs[:, 0].argmax(1) != public.labels).all()
    public.probe = None
    with pytest.raises(FedkitError, match="probe split"):
        build_knowledge(public, [f"probe:cifar-resnet20@{resnet}"])
    with pytest.raises(FedkitError, match="needs its checkpoint"):
        build_knowledge(public, ["probe:cifar-resnet20"])


def test_probe_on_the_model_builder_asks_for_its_pretrained_backbone(monkeypatch):
    import fedkit_core

    asked = []

    def backbone(name, in_channels, pretrained=False):
        asked.append((name, in_channels, pretrained))
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1)), 4

    monkeypatch.setattr(fedkit_core, "build_backbone", backbone)
    public = bright_or_dark(8, seed=0)
    public.probe = bright_or_dark(8, seed=1)
    k = build_knowledge(public, ["probe:model:efficientnet_lite0"])
    assert asked == [("efficientnet_lite0", 3, True)] and k.probs.shape == (8, 1, 2)


def test_a_probe_on_the_model_builder_normalises_its_images_once(monkeypatch):
    """The builder's EfficientNet-Lite normalises [0, 1] images itself (0.5 / 0.5): the probe
    must hand it those images, not ImageNet-normalised ones on top (the weights are not
    needed for this, so random ones stand in)."""
    pytest.importorskip("timm")
    from fedkit_priors.knowledge import _probe_encoder

    import fedkit_core

    real = fedkit_core.build_backbone
    monkeypatch.setattr(fedkit_core, "build_backbone", lambda n, c, pretrained: real(n, c, False))
    encoder = _probe_encoder("model:efficientnet_lite0")
    x = torch.rand(2, 3, encoder.image_size, encoder.image_size)
    torch.testing.assert_close(encoder(x), encoder.net(x))
    assert encoder.image_size == 224


def test_load_public_holds_the_probe_split_out_of_the_public_samples():
    breast = shared_data("medmnist", "breastmnist.npz")
    public = load_public(str(breast))
    with np.load(breast) as f:
        assert len(public.images) == len(f["train_images"]) == 546
        assert (public.probe.images[..., 0] == f["val_images"]).all()  # val: 78 images
        assert (public.probe.labels == f["val_labels"].reshape(-1)).all()
    both = load_public(str(breast), probe_splits=("val", "test"))
    assert len(both.probe.images) == 78 + 156
    with pytest.raises(FedkitError, match="val and/or test"):
        load_public(str(breast), probe_splits=("train",))


def test_api_agreement_scores_each_api_and_each_pair():
    labels = np.array([0, 1, 1, -1])
    right = np.eye(2)[[0, 1, 1, 0]]
    wrong = np.eye(2)[[1, 1, 0, 0]]
    k = Knowledge(
        np.zeros((4, 2, 2, 1), np.uint8),
        np.stack([right, wrong], 1),
        labels,
        ["r", "w"],
        ["a", "b"],
    )
    got = api_agreement(k)
    assert got == {
        "r acc": 1.0,
        "r bacc": 1.0,
        "r vs w disagree": 0.5,
        "w acc": 1 / 3,
        "w bacc": 0.25,  # recall 0 on class 0, 1/2 on class 1
    }


def test_cli_prints_how_the_apis_agree(tmp_path, capsys):
    breast = shared_data("medmnist", "breastmnist.npz")
    resnet = shared_data(*WEIGHTS.split("/"), "resnet20-12fca82f.th")
    out = tmp_path / "k.npz"
    args = ["knowledge", "build", "--public", str(breast), "--limit", "40", "--out", str(out)]
    assert main([*args, "--api", f"probe:cifar-resnet20@{resnet}", "--probe-split", "val"]) == 0
    printed = capsys.readouterr().out
    assert "(40 with labels in the APIs' classes)" in printed and " bacc: " in printed
    assert load_knowledge(out).probs.shape == (40, 1, 2)


# --------------------------------------------------------------------------- segmentation


def fake_public_seg(tmp_path):
    from fedkit_core.testing import write_fake_npz_seg

    return write_fake_npz_seg(tmp_path, sites={"A": (6, 0)}, size=16)


def test_segmentation_knowledge_is_per_pixel_half_precision(tmp_path, capsys):
    public = load_public(str(fake_public_seg(tmp_path)))
    assert public.segmentation and public.labels.shape == (6, 16, 16)
    torch.manual_seed(0)
    torch.save(torch.nn.Conv2d(3, 2, 1), tmp_path / "net.pt")
    k = build_knowledge(public, ["otsu", f"torch:{tmp_path / 'net.pt'}"])
    assert k.probs.shape == (6, 2, 2, 16, 16) and k.probs.dtype == np.float16
    assert np.allclose(k.probs.astype(np.float32).sum(2), 1, atol=2e-3)
    assert (k.labels == public.labels).all()  # two classes each: the masks are kept
    otsu = k.probs[:, 0].argmax(1)
    assert (otsu == public.labels).mean() > 0.9  # the stand-in finds the bright blobs
    out = tmp_path / "k.npz"
    args = ["knowledge", "build", "--public", str(fake_public_seg(tmp_path)), "--api", "otsu"]
    assert main([*args, "--set", "task.image_size=8", "--out", str(out)]) == 0
    assert "per pixel (8 x 8" in capsys.readouterr().out  # stored at the task's size
    back = load_knowledge(out)
    assert back.segmentation and back.probs.dtype == np.float16 and back.labels.dtype == np.int16
    assert back.probs.shape == (6, 1, 2, 8, 8) and back.images.shape == (6, 8, 8, 3)


def test_segmentation_api_from_a_user_factory_and_bad_specs(tmp_path, monkeypatch):
    (tmp_path / "segapi.py").write_text(
        "from torch import nn\n"
        "def make(num_classes, in_channels):\n"
        "    return nn.Conv2d(in_channels, num_classes, 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    public = load_public(str(fake_public_seg(tmp_path)), limit=3)
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 2, 1)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    k = build_knowledge(public, [f"user:segapi:make@{tmp_path / 'w.pt'}"])
    x = torch.from_numpy(public.images).permute(0, 3, 1, 2).float() / 255
    expected = torch.softmax(net(x), 1).detach().numpy()
    assert np.allclose(k.probs[:, 0].astype(np.float32), expected, atol=2e-3)
    with pytest.raises(FedkitError, match="unknown segmentation API"):
        build_knowledge(public, ["cifar-resnet20@x"])
    np.save(tmp_path / "p.npy", np.full((3, 2, 8, 8), 0.5))
    with pytest.raises(FedkitError, match="at the public size"):
        build_knowledge(public, [f"precomputed:{tmp_path / 'p.npy'}"])
