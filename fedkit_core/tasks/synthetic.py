"""``synthetic``: a small, deterministic, multi-site, long-tailed image classification task.

Each class is a fixed spatial pattern (a few Gaussian blobs and a grating). A sample is its
class pattern, randomly shifted and scaled, with a distractor blob and noise. Each site
renders images with its own appearance (contrast, brightness, gamma, colour tint, blur,
noise level), like scanners of different hospitals, and sees the classes with a
long-tailed frequency whose order varies slightly between sites. It is learnable by a small
CNN in seconds, but not trivially: shifts, distractors and site appearance overlap classes.
"""

from __future__ import annotations

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.tasks.spec import TaskSpec

SIZE = 28

SPEC = TaskSpec(
    name="synthetic",
    description="built-in multi-site long-tailed classification (28 px RGB, seconds on a CPU)",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=(
        Option("sites", int, 4, "number of sites (= clients)", min=1),
        Option("num_classes", int, 8, "number of classes", min=2),
        Option("head_samples", int, 150, "training samples of a site's most frequent class", min=1),
        Option("imbalance", float, 15.0, "ratio of the most to the least frequent class", min=1),
    ),
    defaults={"rounds": 20},
)


def load(config: Config) -> TaskData:
    opts = config.section("task")
    rng = np.random.default_rng([int(config["seed"]), 2024])
    num_classes = opts["num_classes"]
    patterns = _class_patterns(rng, num_classes)
    sites: dict[str, dict[str, Split]] = {}
    for s in range(opts["sites"]):
        style = _site_style(rng)
        # long tail: class c gets head * imbalance^(-rank/(C-1)); ranks jittered per site
        ranks = np.argsort(np.argsort(np.arange(num_classes) + rng.normal(0, 1.0, num_classes)))
        train_counts = np.maximum(
            2, np.round(opts["head_samples"] * opts["imbalance"] ** (-ranks / (num_classes - 1)))
        ).astype(int)
        counts = {
            "train": train_counts,
            "val": np.maximum(2, np.round(0.15 * train_counts)).astype(int),
            "test": np.maximum(4, np.round(0.3 * train_counts)).astype(int),
        }
        sites[f"site{s}"] = {split: _render(rng, patterns, style, n) for split, n in counts.items()}
    pooled = sum(sites[s]["train"].class_counts(num_classes) for s in sites)
    order = np.argsort(-pooled)
    third = max(1, num_classes // 3)
    groups = {
        "head": sorted(order[:third].tolist()),
        "medium": sorted(order[third:-third].tolist()),
        "tail": sorted(order[-third:].tolist()),
    }
    return TaskData(
        kind=CLASSIFICATION,
        class_names=[f"pattern{c}" for c in range(num_classes)],
        sites=sites,
        shot_groups=groups,
    )


def _grid() -> tuple[np.ndarray, np.ndarray]:
    return np.meshgrid(np.arange(SIZE), np.arange(SIZE), indexing="ij")


def _class_patterns(rng: np.random.Generator, num_classes: int) -> np.ndarray:
    yy, xx = _grid()
    patterns = np.zeros((num_classes, SIZE, SIZE))
    for c in range(num_classes):
        for _ in range(3):
            cy, cx = rng.uniform(6, SIZE - 6, 2)
            sigma = rng.uniform(2.0, 4.5)
            patterns[c] += rng.choice([-1, 1]) * np.exp(
                -((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma**2)
            )
        angle, freq = rng.uniform(0, np.pi), rng.uniform(0.25, 0.6)
        patterns[c] += 0.35 * np.sin(freq * (np.cos(angle) * xx + np.sin(angle) * yy))
    return patterns


def _site_style(rng: np.random.Generator) -> dict[str, object]:
    return {
        "contrast": rng.uniform(0.85, 1.15),
        "brightness": rng.uniform(-0.05, 0.05),
        "gamma": rng.uniform(0.85, 1.15),
        "tint": rng.uniform(0.95, 1.05, size=3),
        "blur": rng.choice([0.0, 0.5]),
        "noise": rng.uniform(0.15, 0.25),
    }


def _render(
    rng: np.random.Generator, patterns: np.ndarray, style: dict, counts: np.ndarray
) -> Split:
    labels = np.repeat(np.arange(len(counts)), counts)
    rng.shuffle(labels)
    n = len(labels)
    yy, xx = _grid()
    base = patterns[labels] * rng.uniform(0.6, 1.2, size=(n, 1, 1))
    shifts = rng.integers(-4, 5, size=(n, 2))
    base = np.stack([np.roll(img, tuple(s), axis=(0, 1)) for img, s in zip(base, shifts)])
    # a distractor blob somewhere in every image
    cy, cx = rng.uniform(3, SIZE - 3, (2, n, 1, 1))
    base += rng.uniform(-1.2, 1.2, (n, 1, 1)) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 8.0)
    img = 0.5 + 0.25 * base
    if style["blur"]:
        img = _blur(img, style["blur"])
    img = (
        np.clip(style["contrast"] * (img - 0.5) + 0.5 + style["brightness"], 0, 1) ** style["gamma"]
    )
    img = img[:, None] * style["tint"][None, :, None, None]
    img = img + rng.normal(0, style["noise"], img.shape)
    images = torch.from_numpy(np.clip(img * 255, 0, 255).astype(np.uint8))
    return Split(images, torch.from_numpy(labels.astype(np.int64)))


def _blur(img: np.ndarray, sigma: float) -> np.ndarray:
    radius = 2
    k = np.exp(-(np.arange(-radius, radius + 1) ** 2) / (2 * sigma**2))
    k /= k.sum()
    for axis in (1, 2):
        img = sum(
            w * np.roll(img, shift, axis=axis) for shift, w in zip(range(-radius, radius + 1), k)
        )
    return img
