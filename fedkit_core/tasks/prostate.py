"""``prostate``: six-site T2 prostate MRI segmentation (Fed-LWR's ProstateMRI); sites = clients.

Two on-disk layouts are read, per site folder:

* 2D slices, as MiDSS and Fed-LWR's code ship them (``ProstateSlice``):
  ``<site>/{train,val,test}/{image,mask}/*.png``, 384 x 384 grey, an image and its mask
  sharing a file name; masks are 255 background and 0 prostate (``task.mask_foreground``
  says which value is the organ; ``auto`` takes the minority value over the data set).
* per-case NIfTI volumes (the SAML / MS-Net release): ``<site>/Case*.nii.gz`` with
  ``Case*_segmentation.nii.gz`` (or ``_Segmentation``); ``ISBI`` and ``ISBI_1.5`` folders
  are the RUNMC and BMC sites. Each volume's intensities are scaled to 0-255 between its
  0.5 and 99.5 percentiles (MONAI), it is cut into slices along its last axis, slices
  without prostate are dropped, and cases (not slices, so no patient is in two splits)
  are split 6:2:2 into train/val/test with a fixed seed.

Masks become labels 0 background / 1 prostate; images are resized to ``task.image_size``
(default 384, the papers' size).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import SEGMENTATION, SPLITS, Split, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError
from fedkit_core.extras import require
from fedkit_core.tasks import fakes, files
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import SEGMENTATION_DEFAULTS, TaskSpec

VERSION = 1
SITES = ("BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL")
#: folder names of the NIfTI release and the site each one is
ALIASES = {"ISBI": "RUNMC", "ISBI_1.5": "BMC"}
NATIVE_SIZE = 384
CASE_SPLIT = (0.6, 0.2, 0.2)
CASE_SEED = 2024
_SEGMENTATION = re.compile(r"_segmentation$", re.IGNORECASE)

SPEC = TaskSpec(
    name="prostate",
    description="six-site prostate MRI segmentation (Fed-LWR), sites = clients, 384 px",
    kind=SEGMENTATION,
    loader=f"{__name__}:load",
    options=(
        CACHE_OPTION,
        AUGMENT_OPTION,
        TRANSFORMS_OPTION,
        files.PAIRING,
        Option(
            "mask_foreground",
            str,
            "auto",
            "which PNG mask value is prostate: dark (0, as shipped), bright (255), or auto "
            "(the minority value)",
            choices=("auto", "dark", "bright"),
        ),
    ),
    defaults={**SEGMENTATION_DEFAULTS, "task.image_size": 384, "task.val_fraction": 0.25},
    needs_path=True,
    layout=(
        "ProstateSlice/<site>/{train,val,test}/{image,mask}/*.png for the sites BIDMC, BMC, "
        "HK, I2CVB, RUNMC, UCL (grey 384x384 slices; masks 255 background, 0 prostate), "
        "or <site>/Case*.nii.gz with Case*_segmentation.nii.gz volumes"
    ),
    source=(
        "https://liuquande.github.io/SAML/ (the six-site volumes; Liu et al., MICCAI 2020); "
        "2D slices as in https://github.com/MQinghe/MiDSS"
    ),
    default_dir="prostate",
    markers=(
        "*/train/image/*.png",
        "*/*/train/image/*.png",
        "*/Case*.nii*",
        "*/*/Case*.nii*",
    ),
)


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    base = files.find_dir(root, _holds_sites)
    if base is None:
        raise SPEC.layout_error(
            root, f"found none of the site folders {', '.join(SITES)} with data"
        )
    size = opts["image_size"] or NATIVE_SIZE
    # per site: its layout and its file pairs (per split for slices, per case for volumes)
    plan = {}
    for folder in files.subdirs(base):
        layout = _site_layout(folder)
        if layout == "slices":
            plan[folder] = (layout, _slice_pairs(folder, opts["pairing"]))
        elif layout == "volumes":
            plan[folder] = (layout, {"cases": _volume_pairs(folder)})
    inputs = [
        p for _, groups in plan.values() for ps in groups.values() for pair in ps for p in pair
    ]
    params = {"size": size, "pairing": opts["pairing"], "foreground": opts["mask_foreground"]}

    def build() -> TaskData:
        decoded = {
            ALIASES.get(folder.name, folder.name): (layout, _decode(folder, layout, groups, size))
            for folder, (layout, groups) in plan.items()
        }
        return _task_data(decoded, opts["mask_foreground"], base)

    data = cached(SPEC.name, VERSION, base, inputs, params, build, opts["cache"])
    return attach(data, opts["augment"], opts["transforms"])


def _holds_sites(folder: Path) -> bool:
    known = {*SITES, *ALIASES}
    return any(sub.name in known and _site_layout(sub) for sub in files.subdirs(folder))


def _site_layout(folder: Path) -> str | None:
    if any((folder / split / "image").is_dir() for split in SPLITS):
        return "slices"
    if any(_is_volume(p) for p in folder.glob("*.nii*")):
        return "volumes"
    return None


def _is_volume(path: Path) -> bool:
    return path.name.endswith((".nii", ".nii.gz")) and not _SEGMENTATION.search(_stem(path))


def _stem(path: Path) -> str:
    return path.name.removesuffix(".gz").removesuffix(".nii")


def _slice_pairs(folder: Path, pairing: str) -> dict[str, list[tuple[Path, Path]]]:
    pairs = {}
    for split in SPLITS:
        images = files.list_images(folder / split / "image")
        if images:
            masks = files.list_images(folder / split / "mask")
            where = f"{folder.name}/{split}"
            pairs[split] = files.pair_files(images, masks, where, pairing)
    return pairs


def _volume_pairs(folder: Path) -> list[tuple[Path, Path]]:
    volumes = sorted(p for p in folder.glob("*.nii*") if _is_volume(p))
    masks = {
        _SEGMENTATION.sub("", _stem(p)).lower(): p
        for p in folder.glob("*.nii*")
        if _SEGMENTATION.search(_stem(p))
    }
    pairs, lone = [], []
    for volume in volumes:
        mask = masks.get(_stem(volume).lower())
        if mask is None:
            lone.append(volume.name)
        else:
            pairs.append((volume, mask))
    if lone:
        files.warn(f"{folder.name}: skipped volumes without a *_segmentation file: {lone}")
    return pairs


def _decode(folder: Path, layout: str, groups: dict[str, list], size: int) -> dict[str, tuple]:
    """Split name -> (images (N,1,S,S) uint8, masks (N,S,S) uint8).

    Slice masks keep their grey values (their polarity is decided over the data set);
    volume masks are already labels 0 / 1.
    """
    if layout == "slices":
        if not groups.get("train"):
            raise SPEC.layout_error(
                folder, f"site {folder.name}: no image/mask pairs in train/image, train/mask"
            )
        return {split: files.decode_pairs(p, 1, size) for split, p in groups.items() if p}
    cases = groups["cases"]
    if not cases:
        raise SPEC.layout_error(folder, f"site {folder.name}: no Case*.nii.gz with masks")
    order = np.random.default_rng(CASE_SEED).permutation(len(cases))
    n_train = max(1, round(CASE_SPLIT[0] * len(cases)))
    n_val = round(CASE_SPLIT[1] * len(cases))
    parts = {
        "train": order[:n_train],
        "val": order[n_train : n_train + n_val],
        "test": order[n_train + n_val :],
    }
    out = {}
    for split, index in parts.items():
        slices = files.parallel_map(lambda i: _slices(*cases[i], size), sorted(index.tolist()))
        if slices:
            out[split] = tuple(np.concatenate(part) for part in zip(*slices))
    return out


def _slices(volume_path: Path, mask_path: Path, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A case's slices holding prostate: images (K,1,S,S) uint8, labels (K,S,S) 0 / 1."""
    import torch.nn.functional as F

    nib = require("nibabel", "task prostate", "nifti")
    require("monai", "task prostate", "nifti")
    from monai.transforms import ScaleIntensityRangePercentiles

    volume = np.asarray(nib.load(volume_path).dataobj, dtype=np.float32)
    mask = np.asarray(nib.load(mask_path).dataobj) > 0
    volume = volume[..., 0] if volume.ndim == 4 else volume  # (H, W, D, 1)
    mask = mask[..., 0] if mask.ndim == 4 else mask
    if volume.shape != mask.shape or volume.ndim != 3:
        raise FedkitError(
            f"{volume_path} has shape {volume.shape} but its mask {mask_path} has {mask.shape}"
        )
    scale = ScaleIntensityRangePercentiles(lower=0.5, upper=99.5, b_min=0.0, b_max=255.0, clip=True)
    volume = np.asarray(scale(volume[None]))[0]
    keep = np.flatnonzero(mask.reshape(-1, mask.shape[-1]).any(axis=0))
    images = torch.from_numpy(np.ascontiguousarray(volume[..., keep].transpose(2, 0, 1)))[:, None]
    masks = torch.from_numpy(np.ascontiguousarray(mask[..., keep].transpose(2, 0, 1)))[:, None]
    if images.shape[-2:] != (size, size):
        images = F.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
        masks = F.interpolate(masks.float(), size=(size, size), mode="nearest") > 0.5
    images = images.round().clamp(0, 255).to(torch.uint8).numpy()
    return images, masks[:, 0].numpy().astype(np.uint8)


def _task_data(
    decoded: dict[str, tuple[str, dict[str, tuple]]], foreground: str, base: Path
) -> TaskData:
    if foreground == "auto":  # the organ is the minority value of the slice masks
        grey = [m for layout, s in decoded.values() if layout == "slices" for _, m in s.values()]
        bright = sum(int((m >= 128).sum()) for m in grey)
        foreground = "dark" if bright > sum(m.size for m in grey) / 2 else "bright"
    sites = {}
    for site, (layout, splits) in decoded.items():
        sites[site] = {}
        for split, (images, masks) in splits.items():
            if layout == "volumes":
                labels = masks > 0
            else:
                labels = masks < 128 if foreground == "dark" else masks >= 128
            sites[site][split] = Split(
                torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))
            )
    if not sites:
        raise SPEC.layout_error(base, "no site folder holds image/mask data")
    return TaskData(kind=SEGMENTATION, class_names=["background", "prostate"], sites=sites)


def write_fake(
    root: Path,
    sites: Sequence[str] = SITES,
    counts: dict[str, int] | None = None,
    size: int = 24,
    seed: int = 0,
) -> Path:
    """``ProstateSlice/<site>/<split>/{image,mask}/<case>_<slice>.png``: grey images, masks
    255 background / 0 prostate (as shipped). Returns the ``ProstateSlice`` folder."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "ProstateSlice"
    for site in sites:
        for split, n in (counts or {"train": 3, "test": 2}).items():
            for k in range(n):
                organ = fakes.blob(rng, size, size)
                name = f"{k // 2:02d}_{k % 2:02d}.png"
                fakes.save_image(fakes.seg_image(organ), base / site / split / "image" / name)
                mask = np.where(organ, 0, 255).astype(np.uint8)
                fakes.save_image(mask, base / site / split / "mask" / name)
    return base


def write_fake_volumes(
    root: Path,
    sites: Sequence[str] = ("BIDMC", "HK", "ISBI"),
    cases: int = 5,
    shape: tuple[int, int, int] = (20, 20, 6),
    seed: int = 0,
) -> Path:
    """The NIfTI release: ``<site>/CaseNN.nii.gz`` + ``CaseNN_segmentation.nii.gz``
    (``_Segmentation`` for HK); int16 MR intensities; the first and last slice of every
    case hold no prostate. Returns ``root``."""
    nib = require("nibabel", "writing NIfTI files", "nifti")

    rng = np.random.default_rng(seed)
    base = Path(root)
    for site in sites:
        (base / site).mkdir(parents=True, exist_ok=True)
        ending = "_Segmentation" if site == "HK" else "_segmentation"
        for case in range(cases):
            mask = np.zeros(shape, np.uint8)
            for z in range(1, shape[2] - 1):
                mask[..., z] = fakes.blob(rng, *shape[:2])
            volume = np.where(mask, 1500, 300).astype(np.int16) + rng.integers(0, 20, shape)
            affine = np.diag([0.6, 0.6, 3.0, 1.0])
            nib.save(
                nib.Nifti1Image(volume.astype(np.int16), affine),
                base / site / f"Case{case:02d}.nii.gz",
            )
            nib.save(nib.Nifti1Image(mask, affine), base / site / f"Case{case:02d}{ending}.nii.gz")
    return base
