"""``synthetic-seg``: a small prostate-like 2D segmentation task with several scanner sites.

Each image shows an elliptical organ (the target, with a brighter central zone) among
similar-looking neighbouring structures on a textured background. Sites differ like MRI
scanners do: organ/background contrast, MONAI bias field strength, gamma, blur and noise
(MONAI intensity transforms with per-site settings), so a global model serves some sites
worse than others: the situation fairness methods such as Fed-LWR address.
"""

from __future__ import annotations

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import SEGMENTATION, Split, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.extras import require
from fedkit_core.tasks.spec import SEGMENTATION_DEFAULTS, TaskSpec

SIZE = 64

SPEC = TaskSpec(
    name="synthetic-seg",
    description="built-in prostate-like 2D segmentation, sites with scanner-like shifts (MONAI)",
    kind=SEGMENTATION,
    loader=f"{__name__}:load",
    options=(
        Option("sites", int, 4, "number of sites (= clients)"),
        Option("train_per_site", int, 48, "training images per site"),
    ),
    defaults=SEGMENTATION_DEFAULTS,
)


def load(config: Config) -> TaskData:
    require("monai", "task synthetic-seg")
    from monai.transforms import AdjustContrast, GaussianSmooth, RandBiasField

    opts = config.section("task")
    rng = np.random.default_rng([int(config["seed"]), 2025])
    sites: dict[str, dict[str, Split]] = {}
    for s in range(opts["sites"]):
        style = {
            "contrast": rng.uniform(0.12, 0.4),
            "gamma": rng.uniform(0.6, 1.6),
            "blur": rng.uniform(0.3, 1.5),
            "noise": rng.uniform(0.04, 0.12),
            "bias": rng.uniform(0.05, 0.4),
            "size": rng.uniform(0.8, 1.2),
        }
        bias = RandBiasField(degree=3, coeff_range=(0.0, style["bias"]), prob=1.0)
        bias.set_random_state(int(rng.integers(2**31)))
        site_tf = (GaussianSmooth(sigma=style["blur"]), bias, AdjustContrast(gamma=style["gamma"]))
        counts = {
            "train": opts["train_per_site"],
            "val": max(4, opts["train_per_site"] // 4),
            "test": max(8, opts["train_per_site"] // 3),
        }
        sites[f"site{s}"] = {split: _render(rng, n, style, site_tf) for split, n in counts.items()}
    return TaskData(kind=SEGMENTATION, class_names=["background", "organ"], sites=sites)


def _ellipse(yy, xx, cy, cx, a, b, angle) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    u = (xx - cx) * c + (yy - cy) * s
    v = -(xx - cx) * s + (yy - cy) * c
    return (u / a) ** 2 + (v / b) ** 2


def _render(rng: np.random.Generator, n: int, style: dict, site_tf: tuple) -> Split:
    from monai.transforms import GaussianSmooth

    yy, xx = np.meshgrid(np.arange(SIZE), np.arange(SIZE), indexing="ij")
    background = GaussianSmooth(sigma=3.0)
    images, masks = [], []
    for _ in range(n):
        texture = torch.from_numpy(rng.normal(0, 1, (1, SIZE, SIZE)).astype(np.float32))
        img = 0.35 + 0.08 * torch.as_tensor(background(texture))[0].numpy()
        cy, cx = SIZE / 2 + rng.uniform(-7, 7, 2)
        a, b = rng.uniform(9, 15) * style["size"], rng.uniform(7, 12) * style["size"]
        angle = rng.uniform(0, np.pi)
        organ = _ellipse(yy, xx, cy, cx, a, b, angle)
        mask = organ <= 1.0
        img = img + style["contrast"] * np.clip(1.2 - organ, 0, 1)  # soft-edged organ
        img = img + 0.12 * (organ <= 0.3)  # central zone
        for _ in range(rng.integers(1, 3)):  # neighbouring look-alike structures
            dy, dx = rng.uniform(-1, 1, 2)
            norm = max(np.hypot(dy, dx), 1e-3)
            oy, ox = cy + dy / norm * (a + 9), cx + dx / norm * (a + 9)
            other = _ellipse(
                yy, xx, oy, ox, rng.uniform(4, 8), rng.uniform(4, 8), rng.uniform(0, np.pi)
            )
            img = (
                img + rng.uniform(0.5, 1.0) * style["contrast"] * np.clip(1.2 - other, 0, 1) * ~mask
            )
        x = torch.from_numpy(img[None].astype(np.float32))
        for tf in site_tf:
            x = torch.as_tensor(tf(x))
        x = x + torch.from_numpy(rng.normal(0, style["noise"], x.shape).astype(np.float32))
        images.append(x.clamp(0, 1))
        masks.append(torch.from_numpy(mask.astype(np.int64)))
    images_t = (torch.stack(images) * 255).round().to(torch.uint8)
    return Split(images_t, torch.stack(masks))
