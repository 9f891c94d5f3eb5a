"""What the tasks' fake-data writers share: their pixel conventions and image files.

Each data-set module has a ``write_fake(root, ...)`` that writes a tiny copy of its data in
the real layout (folder names, file formats, pixel conventions) and returns the folder (or
file) to use as ``task.path``; tests of fedkit and of plugins load it. Contents encode their
labels so tests can check that images and labels stay aligned: a classification image's
mean grey level is ``40 + 20 * label`` (:func:`class_image`); a segmentation image is bright
(200) inside its mask's foreground and dark (40) outside (:func:`seg_image`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def save_image(array: np.ndarray, path: Path, **kwargs: Any) -> None:
    """``array`` as an image file (format by suffix, through PIL), folders created."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **kwargs)


def blob(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random ellipse (bool mask) well inside the image."""
    yy, xx = np.mgrid[:height, :width]
    cy, cx = rng.uniform(0.35, 0.65) * height, rng.uniform(0.35, 0.65) * width
    ry, rx = rng.uniform(0.15, 0.3) * height, rng.uniform(0.15, 0.3) * width
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def seg_image(mask: np.ndarray) -> np.ndarray:
    """The grey image of a foreground mask: 200 inside, 40 outside."""
    return np.where(mask, 200, 40).astype(np.uint8)


def class_image(rng: np.random.Generator, label: int, shape: tuple[int, ...]) -> np.ndarray:
    """A noisy uint8 image of mean grey level ``40 + 20 * label``."""
    noise = rng.integers(-5, 6, shape)
    return np.clip(40 + 20 * label + noise, 0, 255).astype(np.uint8)
