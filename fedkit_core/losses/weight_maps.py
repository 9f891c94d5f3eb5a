"""U-Net weight maps (Ronneberger et al. 2015, eq. 2) for per-pixel segmentation losses.

``w(x) = w_c(x) + w0 * exp(-(d1(x) + d2(x))^2 / (2 sigma^2))``

* ``w_c``: class balance within the mask, ``n / (C * n_c)`` for a pixel of class ``c``
  (``n`` pixels, ``C`` classes present, ``n_c`` pixels of ``c``): every present class then
  carries the same total weight, and a single-class mask weighs 1 everywhere.
* ``d1``, ``d2``: Euclidean distances (in pixels) to the nearest and the second-nearest
  object, an object being a connected component (8-connected) of one foreground class
  (labels > 0); the distance to an object is 0 on it. With fewer than two objects ``d2`` is
  infinite and the border term is 0. Distances beyond ``6 sigma`` count as infinite (the
  term they would give is below ``1.5e-7 * w0``), so that each object's distances are only
  computed near it.

FedHelp's segmentation variant weights its per-pixel losses with these maps (w0 = 10,
sigma = 5, as the U-Net paper and FedHelp). Pixels labelled ``ignore`` (unknown) weigh 1.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

EIGHT = np.ones((3, 3), dtype=bool)
#: objects farther than REACH * sigma count as absent: their border term would be below
#: w0 * exp(-REACH^2 / 2) = 1.5e-7 * w0
REACH = 6.0


def weight_map(
    mask: np.ndarray, w0: float = 10.0, sigma: float = 5.0, ignore: int = -1
) -> np.ndarray:
    """The weight map (H, W) float32 of one label mask (H, W) (see the module docstring)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"weight_map needs one (H, W) mask, got shape {mask.shape}")
    known = mask != ignore
    weights = np.ones(mask.shape, dtype=np.float64)
    classes, counts = np.unique(mask[known], return_counts=True)
    for c, n in zip(classes, counts, strict=True):
        weights[mask == c] = known.sum() / (len(classes) * n)
    if w0:
        d1, d2 = _two_nearest(mask, known, REACH * sigma)
        weights += w0 * np.exp(-((d1 + d2) ** 2) / (2.0 * sigma**2))
    weights[~known] = 1.0
    return weights.astype(np.float32)


def _two_nearest(
    mask: np.ndarray, known: np.ndarray, reach: float
) -> tuple[np.ndarray, np.ndarray]:
    """Distances to the nearest and second-nearest object (inf where there is none, or
    where an object is farther than ``reach``: each object's distances are computed in its
    bounding box widened by ``reach``, which makes the maps' cost grow with the objects'
    size rather than with their number times the image)."""
    d1 = np.full(mask.shape, np.inf)
    d2 = np.full(mask.shape, np.inf)
    margin = int(np.ceil(reach))
    for c in np.unique(mask[known & (mask > 0)]):
        objects, _ = ndimage.label(mask == c, structure=EIGHT)
        for i, box in enumerate(ndimage.find_objects(objects), start=1):
            window = tuple(
                slice(max(s.start - margin, 0), min(s.stop + margin, n))
                for s, n in zip(box, mask.shape, strict=True)
            )
            d = ndimage.distance_transform_edt(objects[window] != i)
            near, second = d1[window], d2[window]
            d2[window] = np.minimum(second, np.maximum(near, d))
            d1[window] = np.minimum(near, d)
    return d1, d2


def weight_maps(
    masks: torch.Tensor, w0: float = 10.0, sigma: float = 5.0, ignore: int = -1
) -> torch.Tensor:
    """:func:`weight_map` of each mask of a batch (N, H, W), on the masks' device."""
    maps = [weight_map(m, w0, sigma, ignore) for m in masks.detach().cpu().numpy()]
    return torch.from_numpy(np.stack(maps)).to(masks.device)
