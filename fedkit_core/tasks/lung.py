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
from fedkit_core.contract.data import SEGMENTATION, Split, TaskData
from fedkit_core.tasks import fakes, files
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import SEGMENTATION_DEFAULTS, TaskSpec

VERSION = 1
IMAGE_DIRS = ("CXR_png", "images", "image", "imgs", "img")
MASK_DIRS = ("masks", "mask", "ManualMask")
SOURCES = {"MCUCXR": "Montgomery", "CHNCXR": "Shenzhen"}
NATIVE_SIZE = 256

SPEC = TaskSpec(
    name="lung-cxr",
    description="2D lung segmentation in chest X-rays, Montgomery + Shenzhen (FedHelp), 256 px",
    kind=SEGMENTATION,
    loader=f"{__name__}:load",
    options=(CACHE_OPTION, AUGMENT_OPTION, TRANSFORMS_OPTION),
    defaults={**SEGMENTATION_DEFAULTS, "task.image_size": 256},
    needs_path=True,
    layout=(
        "an image folder and a mask folder side by side, e.g. Lung Segmentation/CXR_png/*.png "
        "and Lung Segmentation/masks/*.png (mask = image name, optionally + _mask; 0/255)"
    ),
    source="https://www.kaggle.com/datasets/nikhilpandey360/chest-xray-masks-and-labels",
    default_dir="lung-cxr",
    markers=("*/*.png", "*/*/*.png", "*/*/*/*.png"),
    partitions={  # FedHelp: 2 large and 1 small client, train/test 285/31, 285/31, 65/7
        "fedhelp": {
            "partition.kind": "fractions",
            "clients": 3,
            "partition.fractions": [0.45, 0.45, 0.1],
            "task.test_fraction": 0.1,
        }
    },
)


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    base = files.find_dir(root, lambda d: _folders(d) is not None)
    if base is None:
        raise SPEC.layout_error(
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
        raise SPEC.layout_error(root, f"no image in {image_dir} has a mask in {mask_dir}")
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
    data = cached(SPEC.name, VERSION, base, inputs, {"size": size}, build, opts["cache"])
    return attach(data, opts["augment"], opts["transforms"])


def _folders(folder: Path) -> tuple[Path, Path] | None:
    names = {d.name.lower(): d for d in files.subdirs(folder)}
    image = next((names[n.lower()] for n in IMAGE_DIRS if n.lower() in names), None)
    mask = next((names[n.lower()] for n in MASK_DIRS if n.lower() in names), None)
    if image is None or mask is None or not files.list_images(mask):
        return None
    return image, mask


def write_fake(root: Path, per_source: int = 4, size: int = 40, seed: int = 0) -> Path:
    """``Lung Segmentation/CXR_png/`` and ``masks/`` (Montgomery ``MCUCXR_*.png`` with
    same-name masks, Shenzhen ``CHNCXR_*.png`` with ``*_mask.png``; masks 0/255), plus
    one unannotated image per source and the ``test/`` folder of unannotated images.
    Returns ``root``."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "Lung Segmentation"
    for prefix, ending in (("MCUCXR", ""), ("CHNCXR", "_mask")):
        for k in range(per_source + 1):
            name = f"{prefix}_{k:04d}_{k % 2}"
            lung = fakes.blob(rng, size, size)
            fakes.save_image(fakes.seg_image(lung), base / "CXR_png" / f"{name}.png")
            if k < per_source:
                mask = np.where(lung, 255, 0).astype(np.uint8)
                fakes.save_image(mask, base / "masks" / f"{name}{ending}.png")
    fakes.save_image(np.zeros((size, size), np.uint8), base / "test" / "0001.png")
    return Path(root)
