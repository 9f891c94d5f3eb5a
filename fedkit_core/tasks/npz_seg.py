"""``npz-seg``: any segmentation data in one ``.npz`` file runs without code.

The file holds ``images`` (N, H, W[, C]) uint8 and ``masks`` (N, H, W) integer labels;
optionally ``site`` (N,) (then clients are sites), ``split`` (N,) with values in
{train, val, test} (``all`` or empty: not split, so val and test are carved from it) and
``classes``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import SEGMENTATION, SPLITS, Split, TaskData, classes_up_to
from fedkit_core.errors import FedkitError
from fedkit_core.tasks import fakes, npz
from fedkit_core.tasks.spec import SEGMENTATION_DEFAULTS, TaskSpec

LAYOUT = (
    "an .npz file with images (N,H,W[,C]) uint8, masks (N,H,W) integer labels, "
    "and optionally site (N,), split (N,) in {train,val,test} (all = not split), classes"
)
#: ``split`` values that mean "no split given" (e.g. CHASE_DB1 in drive_chasedb1_512.npz)
UNSPLIT = ("all", "")

SPEC = TaskSpec(
    name="npz-seg",
    description="your segmentation data in one .npz (images, masks, optional site/split)",
    kind=SEGMENTATION,
    loader=f"{__name__}:load",
    needs_path=True,
    layout=LAYOUT,
    defaults=SEGMENTATION_DEFAULTS,
)


def load(config: Config) -> TaskData:
    path = Path(config["task.path"])
    arrays = npz.read_npz(path, ("images", "masks"), LAYOUT, ("site", "split", "classes"))
    images = npz.channels_first(arrays["images"], path, "images")
    masks = npz.integer_labels(arrays["masks"], path, "masks")
    if tuple(masks.shape) != (images.shape[0], *images.shape[2:]):
        raise FedkitError(f"{path}: masks must be (N,H,W) matching images, got {masks.shape}")
    n = len(images)
    site = arrays.get("site", np.full(n, "all"))
    split = arrays.get("split", np.full(n, "train")).astype(str)
    split = np.where(np.isin(split, UNSPLIT), "train", split)  # val/test carved from it
    for key, values in (("site", site), ("split", split)):
        if values.ndim != 1:
            raise FedkitError(f"{path}: {key} must be one value per image, got {values.shape}")
        if len(values) != n:
            raise FedkitError(f"{path}: {key} has {len(values)} entries for {n} images")
    bad = sorted(set(split.astype(str).tolist()) - set(SPLITS))
    if bad:
        raise FedkitError(f"{path}: split values must be train, val or test; found {bad}")
    values = torch.unique(masks).tolist()
    if values[-1] == 255 and len(values) <= 3:  # 0/255 (or 0/128/255) images, not labels
        raise FedkitError(
            f"{path}: masks hold the values {values}, grey levels rather than class labels; "
            "store labels 0, 1, ... (e.g. masks // 255 for binary masks)"
        )
    num_classes = max(2, classes_up_to(values[-1], str(path)))
    sites: dict[str, dict[str, Split]] = {}
    for name in dict.fromkeys(site.astype(str).tolist()):
        in_site = site.astype(str) == name
        sites[name] = {
            s: Split(images[idx], masks[idx])
            for s in SPLITS
            if len(idx := np.flatnonzero(in_site & (split.astype(str) == s)))
        }
    names = npz.class_names(
        arrays, num_classes, ["background"] + [f"class{c}" for c in range(1, num_classes)]
    )
    return TaskData(kind=SEGMENTATION, class_names=names, sites=sites, has_sites="site" in arrays)


def write_fake(
    root: Path,
    sites: dict[str, tuple[int, int]] | None = None,
    size: int = 16,
    channels: int = 3,
    seed: int = 0,
) -> Path:
    """``root/fake-seg.npz``: a bright blob (label 1) per image on a dark background, with
    ``site`` and ``split`` arrays; ``sites``: site -> (train, test) counts. Returns the file."""
    rng = np.random.default_rng(seed)
    plan = [
        (site, split)
        for site, (n_train, n_test) in (sites or {"A": (15, 5), "B": (10, 0)}).items()
        for split in ["train"] * n_train + ["test"] * n_test
    ]
    masks = np.stack([fakes.blob(rng, size, size) for _ in plan]).astype(np.uint8)
    images = fakes.seg_image(masks)
    if channels > 1:
        images = np.repeat(images[..., None], channels, axis=-1)
    path = Path(root) / "fake-seg.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        images=images,
        masks=masks,
        site=np.array([site for site, _ in plan]),
        split=np.array([split for _, split in plan]),
    )
    return path
