"""Self-supervised pre-training of a prior encoder on a public image set (``fedkit prior
pretrain``).

Fed-MAS needs a frozen encoder whose features separate the clients' classes; the offline
CIFAR-10 classifier does not (``docs/priors.md``). This trains one of the priors'
architectures (:func:`fedkit_priors.encoders.build_encoder`) with SimCLR or MoCo-v2 from the
maintained ``lightly`` library (its losses, projection heads, momentum update and
augmentations; nothing hand-written) on images that are **not** the clients' data, and
writes a checkpoint that :func:`fedkit_priors.frozen_encoder` loads as it is.

Images come from MedMNIST-style ``.npz`` files (``train_images``), segmentation ``.npz``
files (``images``), folders of image files, or a fedkit task's pooled training split. The
encoder is trained at its own input size and normalisation, the ones the frozen prior uses.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core import FedkitError

METHODS = ("simclr", "moco")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
#: smallest image set a contrastive batch can be drawn from
MIN_IMAGES = 8


@dataclass
class PretrainSettings:
    """What to train and how; the defaults fit a CPU in minutes for a small encoder."""

    source: str = "cifar-resnet20"
    method: str = "simclr"
    epochs: int = 20
    batch_size: int = 256
    lr: float | None = None  # default 0.06 * batch_size / 256 (lightly's examples)
    temperature: float | None = None  # default 0.5 (SimCLR), 0.2 (MoCo-v2)
    memory_bank: int = 4096  # MoCo-v2's queue of negatives
    seed: int = 0


def load_images(sources: Sequence[str | Path], max_side: int) -> torch.Tensor:
    """uint8 RGB images (N, 3, H, W) from ``.npz`` files and folders, each resized so its
    longer side is at most ``max_side`` (cheap augmentation of large photographs)."""
    if not sources:
        raise FedkitError("give at least one image source (--data FILE.npz or FOLDER)")
    return combine([_from_source(Path(s), max_side) for s in sources])


def combine(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One uint8 tensor of image sets of possibly different sizes (the smallest side wins)."""
    sizes = {tuple(p.shape[-2:]) for p in parts}
    if len(sizes) > 1:  # e.g. two MedMNIST files at different sizes: one common size
        side = min(max(s) for s in sizes)
        parts = [_resize(p, side) for p in parts]
    return torch.cat(list(parts))


def as_uint8_rgb(images: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) images as uint8 with 3 channels (grey repeated; float data clipped to
    [0, 1])."""
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise FedkitError(f"expected images (N, 1 or 3, H, W), got shape {tuple(images.shape)}")
    if images.dtype != torch.uint8:
        images = (images.float().clamp(0, 1) * 255).round().to(torch.uint8)
    return images.expand(-1, 3, -1, -1).contiguous() if images.shape[1] == 1 else images


def _from_source(path: Path, max_side: int) -> torch.Tensor:
    if path.is_dir():
        images = _from_folder(path, max_side)
    elif path.suffix == ".npz" and path.is_file():
        images = _from_npz(path)
    elif not path.exists():
        raise FedkitError(f"image source not found: {path}")
    else:
        raise FedkitError(f"{path}: give a .npz file or a folder of images")
    images = as_uint8_rgb(images)
    return _resize(images, max_side) if max(images.shape[-2:]) > max_side else images


def _from_npz(path: Path) -> torch.Tensor:
    try:
        npz = np.load(path)
    except Exception as err:
        raise FedkitError(f"cannot read {path}: {err}") from None
    with npz:
        key = next((k for k in ("train_images", "images") if k in npz.files), None)
        if key is None:
            raise FedkitError(
                f"{path} has no 'train_images' (MedMNIST format) or 'images' array; "
                f"it has {', '.join(npz.files)}"
            )
        array = npz[key]
    if array.ndim == 3:
        array = array[..., None]
    if array.ndim != 4 or array.shape[-1] not in (1, 3):
        raise FedkitError(f"{path}: {key} must be (N, H, W) or (N, H, W, 1|3), got {array.shape}")
    return torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2)


def _from_folder(folder: Path, max_side: int) -> torch.Tensor:
    from PIL import Image

    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FedkitError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) under {folder}")
    images = []
    for file in files:
        with Image.open(file) as img:
            img = img.convert("RGB")
            img.thumbnail((max_side, max_side))
            square = img.resize((min(img.size),) * 2)  # one size for every file of the folder
            images.append(torch.from_numpy(np.array(square)).permute(2, 0, 1))
    side = min(im.shape[-1] for im in images)
    return torch.stack([_resize(im[None], side)[0] for im in images])


def _resize(images: torch.Tensor, side: int) -> torch.Tensor:
    if tuple(images.shape[-2:]) == (side, side):
        return images
    out = F.interpolate(images.float(), size=(side, side), mode="bilinear", antialias=True)
    return out.round().clamp(0, 255).to(torch.uint8)


class _Views(torch.utils.data.Dataset):
    """Two augmented views of each image, by lightly's transform."""

    def __init__(self, images: torch.Tensor, transform: Callable[[Any], list[torch.Tensor]]):
        from torchvision.transforms.functional import to_pil_image

        self.images, self.transform, self.to_pil = images, transform, to_pil_image

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> list[torch.Tensor]:
        return self.transform(self.to_pil(self.images[i]))


class _Pooled(nn.Module):
    """The encoder's pooled feature (N, D), as the frozen prior returns it."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out.flatten(2).mean(-1) if out.dim() > 2 else out


def pretrain(
    images: torch.Tensor,
    settings: PretrainSettings,
    on_step: Callable[[int, int, float], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Train the encoder ``settings.source`` on ``images`` (uint8, (N, 3, H, W)).

    Returns the encoder's state dict and a description (method, size, normalisation, final
    loss). ``on_step(step, total, loss)`` is called after every optimiser step.
    """
    from lightly.loss import NTXentLoss
    from lightly.models.modules import MoCoProjectionHead, SimCLRProjectionHead
    from lightly.models.utils import deactivate_requires_grad, update_momentum
    from lightly.transforms import MoCoV2Transform, SimCLRTransform
    from lightly.utils.scheduler import cosine_schedule

    from fedkit_priors.encoders import build_encoder

    if settings.method not in METHODS:
        raise FedkitError(f"unknown method {settings.method!r}: use {' or '.join(METHODS)}")
    if len(images) < MIN_IMAGES:
        raise FedkitError(f"pre-training needs at least {MIN_IMAGES} images, got {len(images)}")
    if settings.epochs < 1 or settings.batch_size < 2:
        raise FedkitError("pre-training needs epochs >= 1 and a batch size >= 2")
    torch.manual_seed(settings.seed)
    net, size, (mean, std) = build_encoder(settings.source)
    backbone = _Pooled(net)
    with torch.no_grad():  # in eval mode: the probe must not touch batch-norm statistics
        dim = int(backbone.eval()(torch.zeros(1, 3, size, size)).shape[1])
    normalize = {"mean": list(mean), "std": list(std)}
    moco = settings.method == "moco"
    # small images: no Gaussian blur (as lightly's CIFAR settings); otherwise the defaults
    blur = 0.0 if size <= 64 else 0.5
    if moco:
        transform = MoCoV2Transform(input_size=size, gaussian_blur=blur, normalize=normalize)
        head = MoCoProjectionHead(dim, 512, 128)
    else:
        transform = SimCLRTransform(input_size=size, gaussian_blur=blur, normalize=normalize)
        head = SimCLRProjectionHead(dim, 512, 128)
    temperature = settings.temperature or (0.2 if moco else 0.5)
    criterion = NTXentLoss(
        temperature=temperature, memory_bank_size=(settings.memory_bank, 128) if moco else 0
    )
    model = nn.Sequential(backbone, head)
    momentum_model = copy.deepcopy(model) if moco else None
    if momentum_model is not None:
        deactivate_requires_grad(momentum_model)
    batch = min(settings.batch_size, len(images))
    loader = torch.utils.data.DataLoader(
        _Views(images, transform),
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(settings.seed),
    )
    lr = settings.lr or 0.06 * batch / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    total = settings.epochs * len(loader)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, total)
    step, loss_value = 0, math.nan
    model.train()
    for epoch in range(settings.epochs):
        momentum = cosine_schedule(epoch, settings.epochs, 0.996, 1.0)
        for first, second in loader:
            if momentum_model is not None:
                update_momentum(model, momentum_model, m=momentum)
                with torch.no_grad():
                    key = momentum_model(second).detach()
                loss = criterion(model(first), key)
            else:
                loss = criterion(model(first), model(second))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step, loss_value = step + 1, float(loss.detach())
            if not math.isfinite(loss_value):
                raise FedkitError(
                    f"the {settings.method} loss became {loss_value} at step {step}; lower --lr"
                )
            if on_step is not None:
                on_step(step, total, loss_value)
    info = {
        "source": settings.source,
        "method": settings.method,
        "epochs": settings.epochs,
        "batch_size": batch,
        "lr": lr,
        "temperature": temperature,
        "images": len(images),
        "image_size": size,
        "mean": list(mean),
        "std": list(std),
        "seed": settings.seed,
        "final_loss": loss_value,
    }
    state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
    return state, info


def save_prior(path: str | Path, state: dict[str, torch.Tensor], info: dict[str, Any]) -> Path:
    """Write the encoder as ``{"state_dict": ..., "fedkit_prior": info}`` (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"state_dict": state, "fedkit_prior": info}, tmp)
    tmp.replace(path)
    return path
