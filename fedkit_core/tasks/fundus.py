"""``rif``: optic disc and cup segmentation in retinal fundus images of four sites (Fed-LWR's RIF).

Layout (DoFE's release, as MiDSS and Fed-LWR's code read it):
``Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}/*.png``: Domain1 Drishti-GS,
Domain2 RIM-ONE-r3, Domain3 REFUGE train, Domain4 REFUGE val (sites = clients, named so;
further ``Domain*`` folders become sites under their folder name). Images are 800 x 800
RGB crops around the disc; masks are RGB with 255 background, 128 optic disc and 0 cup,
mapped to labels 0 background, 1 rim (disc outside the cup), 2 cup. Images are resized to
``task.image_size`` (default 384, as in Fed-LWR); a site's train split is cut 4:1 into
train and val (``task.val_fraction`` 0.2). The ``*_file_list.txt`` files are not needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import SEGMENTATION, SPLITS, Split, TaskData
from fedkit_core.tasks import fakes, files
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import SEGMENTATION_DEFAULTS, TaskSpec

VERSION = 1
DOMAINS = {
    "Domain1": "Drishti-GS",
    "Domain2": "RIM-ONE-r3",
    "Domain3": "REFUGE-train",
    "Domain4": "REFUGE-val",
}
CLASSES = ["background", "rim", "cup"]
NATIVE_SIZE = 384

SPEC = TaskSpec(
    name="rif",
    description="four-site fundus optic disc/cup segmentation (Fed-LWR's RIF), 384 px",
    kind=SEGMENTATION,
    loader=f"{__name__}:load",
    options=(CACHE_OPTION, AUGMENT_OPTION, TRANSFORMS_OPTION, files.PAIRING),
    defaults={**SEGMENTATION_DEFAULTS, "task.image_size": 384, "task.val_fraction": 0.2},
    needs_path=True,
    layout=(
        "Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}/*.png (Drishti-GS, RIM-ONE-r3, "
        "REFUGE train, REFUGE val; RGB masks 255 background, 128 optic disc, 0 cup)"
    ),
    source="https://github.com/emma-sjwang/Dofe (DoFE, Wang et al., IEEE TMI 2020)",
    default_dir="rif",
    markers=("Domain*/train/ROIs/image/*.png", "*/Domain*/train/ROIs/image/*.png"),
)


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    base = files.find_dir(root, lambda d: bool(_domains(d)))
    if base is None:
        raise SPEC.layout_error(root, "found no Domain*/train/ROIs/image folder with fundus images")
    size = opts["image_size"] or NATIVE_SIZE
    pairs = {domain: _pairs(domain, opts["pairing"]) for domain in _domains(base)}
    inputs = [p for splits in pairs.values() for ps in splits.values() for pair in ps for p in pair]

    def build() -> TaskData:
        sites = {}
        for domain, splits in pairs.items():
            if not splits.get("train"):
                raise SPEC.layout_error(
                    base, f"{domain.name}: no image/mask pairs in train/ROIs/{{image,mask}}"
                )
            sites[DOMAINS.get(domain.name, domain.name)] = {
                split: _split(*files.decode_pairs(ps, 3, size)) for split, ps in splits.items()
            }
        return TaskData(kind=SEGMENTATION, class_names=list(CLASSES), sites=sites)

    data = cached(
        SPEC.name,
        VERSION,
        base,
        inputs,
        {"size": size, "pairing": opts["pairing"]},
        build,
        opts["cache"],
    )
    return attach(data, opts["augment"], opts["transforms"])


def _domains(folder: Path) -> list[Path]:
    return [
        d
        for d in files.subdirs(folder)
        if d.name.startswith("Domain") and (d / "train" / "ROIs" / "image").is_dir()
    ]


def _pairs(domain: Path, pairing: str) -> dict[str, list[tuple[Path, Path]]]:
    out = {}
    for split in SPLITS:
        rois = domain / split / "ROIs"
        images = files.list_images(rois / "image")
        if images:
            masks = files.list_images(rois / "mask")
            out[split] = files.pair_files(images, masks, f"{domain.name}/{split}", pairing)
    return out


def mask_labels(grey: np.ndarray) -> np.ndarray:
    """Mask grey values to labels: 255 background -> 0, 128 disc -> 1 (rim), 0 cup -> 2."""
    return np.where(grey < 64, 2, np.where(grey < 192, 1, 0)).astype(np.int64)


def _split(images: np.ndarray, grey: np.ndarray) -> Split:
    return Split(torch.from_numpy(images), torch.from_numpy(mask_labels(grey)))


def write_fake(
    root: Path, counts: dict[str, int] | None = None, size: int = 32, seed: int = 0
) -> Path:
    """``Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}/*.png``: RGB images, RGB masks
    255 background, 128 optic disc, 0 cup; Domain2 with its file lists. Returns ``Fundus``."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "Fundus"
    prefixes = {1: "gdrishtiGS_", 2: "G-", 3: "g", 4: "V"}
    for d, prefix in prefixes.items():
        for split, n in (counts or {"train": 3, "test": 2}).items():
            rois = base / f"Domain{d}" / split / "ROIs"
            for k in range(n):
                disc = fakes.blob(rng, size, size)
                yy, xx = np.nonzero(disc)
                cup = np.zeros_like(disc)
                cy, cx = int(yy.mean()), int(xx.mean())
                cup[cy - 2 : cy + 3, cx - 2 : cx + 3] = True
                grey = np.where(cup, 0, np.where(disc, 128, 255)).astype(np.uint8)
                image = np.stack([fakes.seg_image(disc)] * 3, -1)
                image[cup] = 250
                name = f"{prefix}{k + 1:03d}-{split}.png"
                fakes.save_image(image, rois / "image" / name)
                fakes.save_image(np.stack([grey] * 3, -1), rois / "mask" / name)
    (base / "Domain2" / "test_file_list.txt").write_text("G-1-test.jpg\n")
    (base / "readme.md").write_text("Domain1: Drishti-GS ...\n")
    return base
