"""``fedkit prior pretrain``: SimCLR / MoCo-v2 (lightly) on a tiny image set writes a
checkpoint that the priors loader reads as it is; bad input exits 2 with one message."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fedkit_priors.encoders import build_encoder, frozen_encoder

from fedkit_core import load_state_file
from fedkit_core.plugin import FedkitError
from fedkit_core.testing import fedkit_command as main

pytest.importorskip("lightly")

from fedkit_priors.pretrain import PretrainSettings, load_images, pretrain  # noqa: E402


def _pictures(n: int, size: int, channels: int, seed: int = 0) -> np.ndarray:
    """Blobs at random places on a dark background: images with some structure, uint8."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    out = np.zeros((n, size, size, channels), dtype=np.uint8)
    for i in range(n):
        cy, cx, r = rng.uniform(0, size, 2).tolist() + [rng.uniform(2, size / 3)]
        blob = ((yy - cy) ** 2 + (xx - cx) ** 2 < r**2) * rng.uniform(80, 255, channels)[
            :, None, None
        ]
        out[i] = blob.transpose(1, 2, 0).astype(np.uint8)
    return out


@pytest.fixture
def medmnist_npz(tmp_path):
    path = tmp_path / "public.npz"
    np.savez(path, train_images=_pictures(16, 28, 1), train_labels=np.zeros((16, 1)))
    return path


def test_cli_writes_a_checkpoint_the_priors_loader_reads(tmp_path, medmnist_npz, capsys):
    out = tmp_path / "prior.pt"
    args = ["prior", "pretrain", "--data", str(medmnist_npz), "--epochs", "2"]
    assert main([*args, "--batch-size", "8", "--seed", "3", "--out", str(out), "-q"]) == 0
    assert "fed-mas.prior_weights=" in capsys.readouterr().out
    blob = torch.load(out, weights_only=True)
    info = blob["fedkit_prior"]
    assert (info["method"], info["images"], info["image_size"], info["batch_size"]) == (
        "simclr",
        16,
        32,
        8,
    )
    assert np.isfinite(info["final_loss"])
    # every entry of the encoder is in the file, and the loader takes them as they are
    encoder = frozen_encoder("cifar-resnet20", str(out))
    state = load_state_file(str(out))
    for key, value in encoder.net.state_dict().items():
        if not key.endswith("num_batches_tracked"):  # not loaded (see load_matching)
            assert torch.equal(value, state[key]), key
    assert int(state["bn1.num_batches_tracked"]) == 8  # 2 epochs x 2 steps x 2 views
    # ... and they were trained: not the initial weights of the same seed
    torch.manual_seed(3)
    initial = build_encoder("cifar-resnet20")[0].state_dict()
    assert not torch.equal(initial["conv1.weight"], state["conv1.weight"])
    assert encoder(torch.rand(2, 1, 28, 28)).shape == (2, 64)


def test_moco_on_a_folder_of_images_of_different_sizes(tmp_path):
    from PIL import Image

    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for i, picture in enumerate(_pictures(10, 80, 3)):
        size = 80 if i % 2 else 50
        Image.fromarray(picture).resize((size, size)).save(folder / "sub" / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    images = load_images([folder], max_side=64)
    assert images.shape == (10, 3, 50, 50) and images.dtype == torch.uint8
    steps = []
    settings = PretrainSettings(method="moco", epochs=2, batch_size=4, memory_bank=16)
    state, info = pretrain(images, settings, lambda s, t, loss: steps.append((s, t, loss)))
    assert [s for s, _, _ in steps] == [1, 2, 3, 4] and steps[-1][1] == 4
    assert info["method"] == "moco" and info["temperature"] == 0.2
    assert all(np.isfinite(loss) for _, _, loss in steps)
    assert set(state) == set(build_encoder("cifar-resnet20")[0].state_dict())


def test_the_same_seed_gives_the_same_prior(medmnist_npz):
    images = load_images([medmnist_npz], max_side=64)
    settings = PretrainSettings(epochs=1, batch_size=8, seed=1)
    first, _ = pretrain(images, settings)
    second, _ = pretrain(images, settings)
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(
    "case, message",
    [
        ([], "give the images to pre-train on"),
        (["--data", "missing.npz"], "image source not found"),
        (["--data", "{bad}"], "no 'train_images'"),
        (["--data", "{npz}", "--method", "byol"], "unknown method 'byol'"),
        (["--data", "{npz}", "--prior", "open_clip:ViT-B-32"], "cannot be pre-trained"),
        (["--data", "{npz}", "--set", "rounds=2"], "--set configures the task"),
        (["--data", "{few}"], "at least 8 images"),
    ],
)
def test_bad_input_exits_2_with_one_message(case, message, tmp_path, medmnist_npz, capsys):
    bad, few = tmp_path / "bad.npz", tmp_path / "few.npz"
    np.savez(bad, labels=np.zeros(3))
    np.savez(few, images=_pictures(3, 28, 3))
    paths = {"{npz}": str(medmnist_npz), "{bad}": str(bad), "{few}": str(few)}
    args = [paths.get(a, a) for a in case]
    assert main(["prior", "pretrain", *args, "--out", str(tmp_path / "p.pt"), "-q"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "p.pt").exists()


@pytest.mark.slow
def test_task_images_are_pooled_over_clients(tmp_path):
    out = tmp_path / "prior.pt"
    args = ["prior", "pretrain", "--task", "synthetic", "--set", "task.sites=2"]
    assert main([*args, "--epochs", "1", "--out", str(out), "-q"]) == 0
    assert torch.load(out, weights_only=True)["fedkit_prior"]["images"] >= 8


def test_pretrain_refuses_too_little(medmnist_npz):
    images = load_images([medmnist_npz], max_side=64)
    with pytest.raises(FedkitError, match="epochs >= 1"):
        pretrain(images, PretrainSettings(epochs=0))
