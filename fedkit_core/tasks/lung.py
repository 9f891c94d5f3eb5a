"""``lung-cxr``: 2D lung segmentation in chest X-rays (FedHelp's lung task).

Layout (Kaggle "Chest X-ray Masks and Labels", the Montgomery and Shenzhen sets):
an image folder and a mask folder side by side, e.g. ``Lung Segmentation/CXR_png/*.png``
and ``Lung Segmentation/masks/*.png``. A mask shares its image's name, optionally with a
``_mask`` ending (Shenzhen's ``CHNCXR_0001_0_mask.png``); images without a mask (96 of
the 800) are not used, leaving 704. Masks are 0 background / 255 lung -> labels 0 / 1;
images are grey, resized to ``task.image_size`` (default 256). When the file names carry
the source prefixes (``MCUCXR`` Montgomery, ``CHNCXR`` Shenzhen) the two sources are sites;
FedHelp's three clients are the named partition ``fedhelp``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.tasks import files
from fedkit_core.tasks.augment import attach
from fedkit_core.tasks.base import SEGMENTATION, Split, TaskData
from fedkit_core.tasks.cache import cached

NAME = "lung-cxr"
VERSION = 1
IMAGE_DIRS = ("CXR_png", "images", "image", "imgs", "img")
MASK_DIRS = ("masks", "mask", "ManualMask")
SOURCES = {"MCUCXR": "Montgomery", "CHNCXR": "Shenzhen"}
NATIVE_SIZE = 256


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    base = files.find_dir(root, lambda d: _folders(d) is not None)
    if base is None:
        raise files.layout_error(
            NAME,
            root,
            f"found no image folder ({', '.join(IMAGE_DIRS)}) beside a mask folder "
            f"({', '.join(MASK_DIRS)})",
        )
    image_dir, mask_dir = _folders(base)
    masks = files.list_images(mask_dir)
    keys = {files.mask_key(m) for m in masks}  # unannotated images are expected: not reported
    images = [i for i in files.list_images(image_dir) if files.mask_key(i) in keys]
    pairs = files.pair_files(images, masks, base.name, "name")
    if not pairs:
        raise files.layout_error(NAME, root, f"no image in {image_dir} has a mask in {mask_dir}")
    size = opts["image_size"] or NATIVE_SIZE
    groups = {}
    for pair in pairs:
        groups.setdefault(SOURCES.get(pair[0].name.split("_")[0].upper()), []).append(pair)
    has_sites = None not in groups

    def build() -> TaskData:
        sites = {}
        for source, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
            images, grey = files.decode_pairs(members, 1, size)
            labels = torch.from_numpy((grey >= 128).astype(np.int64))
            sites[source or "all"] = {"train": Split(torch.from_numpy(images), labels)}
        if not has_sites:  # unknown file names: one pool for the partitioners
            sites = {"all": {"train": Split.concat([s["train"] for s in sites.values()])}}
        return TaskData(
            kind=SEGMENTATION, class_names=["background", "lung"], sites=sites, has_sites=has_sites
        )

    inputs = [p for pair in pairs for p in pair]
    data = cached(NAME, VERSION, base, inputs, {"size": size}, build, opts["cache"])
    return attach(data, opts["augment"])


def _folders(folder: Path) -> tuple[Path, Path] | None:
    names = {d.name.lower(): d for d in files.subdirs(folder)}
    image = next((names[n.lower()] for n in IMAGE_DIRS if n.lower() in names), None)
    mask = next((names[n.lower()] for n in MASK_DIRS if n.lower() in names), None)
    if image is None or mask is None or not files.list_images(mask):
        return None
    return image, mask
