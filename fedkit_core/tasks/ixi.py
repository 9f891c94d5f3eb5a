"""``ixi``: Fed-IXI-Tiny (FLamby): 3D brain masks from T1 MRI of three London centres = clients.

Layout (FLamby's ``fed_ixi`` download, unpacked): ``IXI_sample/IXI<ID>-<centre>-<n>/T1/
*.nii.gz`` with ``IXI_sample/IXI<ID>-<centre>-<n>/label/*.nii.gz`` for the centres Guys, HH
and IOP, and FLamby's ``metadata_tiny.csv`` (``Patient ID``, ``Split``) giving the official
train/test split (train/test 249/62, 145/36, 59/15), found anywhere up to three levels
under ``task.path`` or given as ``task.metadata``. As in FLamby, each volume is resized to
``task.shape`` (default 48 x 60 x 48, MONAI ``Resize``) and z-scored over the volume
(MONAI ``NormalizeIntensity``); masks are resized by nearest neighbour (FLamby's area
resize followed by truncation erodes the mask edge slightly). Images are (N, 1, D, H, W)
float, masks (N, D, H, W); the model is a 3D U-Net.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import SEGMENTATION, Normalizer, Split, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.extras import require
from fedkit_core.tasks import files
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import SEGMENTATION_DEFAULTS, TaskSpec

VERSION = 1
METADATA = "metadata_tiny.csv"
SUBJECT = re.compile(r"^IXI(\d{3})-([A-Za-z]+)-\d+")

SPEC = TaskSpec(
    name="ixi",
    description="Fed-IXI-Tiny 3D brain masks from T1 MRI, three centres (FLamby), 48x60x48",
    kind=SEGMENTATION,
    loader=f"{__name__}:load",
    options=(
        CACHE_OPTION,
        AUGMENT_OPTION,
        TRANSFORMS_OPTION,
        Option("shape", "list[int]", [48, 60, 48], "volume size after resizing (FLamby's)"),
        Option("metadata", str, None, "FLamby's metadata_tiny.csv (default: found in task.path)"),
    ),
    # a 3-level U-Net: 60 voxels halve twice without remainder (FLamby's U-Net has 3 blocks)
    defaults={**SEGMENTATION_DEFAULTS, "unet_channels": [16, 32, 64]},
    needs_path=True,
    layout=(
        "IXI_sample/IXI<ID>-<Guys|HH|IOP>-<n>/{T1,label}/*.nii.gz and FLamby's "
        "metadata_tiny.csv (columns Patient ID, Split)"
    ),
    source=(
        "FLamby's fed_ixi download (https://github.com/owkin/FLamby/tree/main/flamby/"
        "datasets/fed_ixi); IXI: https://brain-development.org/ixi-dataset/"
    ),
    default_dir="ixi",
    markers=("IXI*-*/T1", "*/IXI*-*/T1", "*/*/IXI*-*/T1"),
)


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    base = files.find_dir(root, lambda d: bool(_subjects(d)))
    if base is None:
        raise SPEC.layout_error(root, "found no IXI<ID>-<centre>-<n>/T1 subject folders")
    metadata = _metadata_path(root, base, opts["metadata"])
    split_of = _read_metadata(metadata)
    shape = tuple(opts["shape"])
    cases, lone = [], []
    for subject in _subjects(base):
        match = SUBJECT.match(subject.name)
        image = sorted((subject / "T1").glob("*.nii*"))
        label = sorted((subject / "label").glob("*.nii*"))
        patient = int(match.group(1))
        if not image or not label or patient not in split_of:
            lone.append(subject.name)
            continue
        cases.append((match.group(2), split_of[patient], image[0], label[0]))
    if lone:
        files.warn(f"ixi: skipped subjects without a T1 image, a label or a metadata row: {lone}")
    if not cases:
        raise SPEC.layout_error(root, "no subject has a T1 image, a label and a split")
    inputs = [metadata, *(p for case in cases for p in case[2:])]  # the splits come from it

    def build() -> TaskData:
        volumes = files.parallel_map(lambda case: _volume(case[2], case[3], shape), cases)
        sites: dict[str, dict[str, list]] = {}
        for (centre, split, _, _), volume in zip(cases, volumes):
            sites.setdefault(centre, {}).setdefault(split, []).append(volume)
        return TaskData(
            kind=SEGMENTATION,
            class_names=["background", "brain"],
            sites={
                centre: {
                    split: Split(
                        torch.from_numpy(np.stack([v[0] for v in vols])),
                        torch.from_numpy(np.stack([v[1] for v in vols])),
                    )
                    for split, vols in sorted(splits.items())
                }
                for centre, splits in sorted(sites.items())
            },
        )

    data = cached(SPEC.name, VERSION, base, inputs, {"shape": shape}, build, opts["cache"])
    data.normalizer = Normalizer(mean=(0.0,), std=(1.0,))  # already z-scored per volume
    return attach(data, opts["augment"], opts["transforms"])


def _subjects(folder: Path) -> list[Path]:
    return [d for d in files.subdirs(folder) if SUBJECT.match(d.name) and (d / "T1").is_dir()]


def _metadata_path(root: Path, base: Path, given: str | None) -> Path:
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise SPEC.layout_error(root, f"task.metadata={given} is not a file")
        return path
    for folder in dict.fromkeys([base, base.parent, root]):
        for pattern in (METADATA, f"*/{METADATA}", f"*/*/{METADATA}"):
            found = sorted(folder.glob(pattern))
            if found:
                return found[0]
    raise SPEC.layout_error(
        root,
        f"found no {METADATA} (FLamby's official split; it ships in FLamby as "
        f"flamby/datasets/fed_ixi/metadata/{METADATA}): copy it into task.path or set "
        "task.metadata=PATH",
    )


def _read_metadata(path: Path) -> dict[int, str]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows or not {"Patient ID", "Split"} <= set(rows[0]):
        raise SPEC.layout_error(path, f"{path.name} needs the columns 'Patient ID', 'Split'")
    return {int(r["Patient ID"]): r["Split"].strip() for r in rows}


def _volume(image: Path, label: Path, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(1, D, H, W) z-scored float32 image and (D, H, W) int64 mask at ``shape``."""
    nib = require("nibabel", "task ixi", "nifti")
    require("monai", "task ixi", "nifti")
    from monai.transforms import NormalizeIntensity, Resize

    volume = np.asarray(nib.load(image).dataobj, dtype=np.float32)[None]
    mask = np.asarray(nib.load(label).dataobj, dtype=np.float32)[None]
    volume = NormalizeIntensity()(Resize(shape)(volume))
    mask = Resize(shape, mode="nearest")(mask)
    return (
        np.asarray(volume, dtype=np.float32),
        (np.asarray(mask)[0] > 0.5).astype(np.int64),
    )


def write_fake(
    root: Path,
    subjects: dict[str, tuple[int, int]] | None = None,
    shape: tuple[int, int, int] = (14, 16, 12),
    seed: int = 0,
) -> Path:
    """FLamby's ``IXI_sample/IXI<ID>-<centre>-<n>/{T1,label}/*.nii.gz`` (inside the
    download's folder) and ``metadata_tiny.csv``; ``subjects``: centre -> (train, test)
    counts. Returns ``root``."""
    nib = require("nibabel", "writing NIfTI files", "nifti")

    rng = np.random.default_rng(seed)
    base = Path(root) / "7kd5wj7v7p-3" / "IXI_sample"
    rows, patient = [], 2
    for centre, (n_train, n_test) in (
        subjects or {"Guys": (3, 1), "HH": (2, 1), "IOP": (2, 1)}
    ).items():
        for split in ["train"] * n_train + ["test"] * n_test:
            name = f"IXI{patient:03d}-{centre}-{1000 + patient}"
            brain = np.zeros(shape, np.uint8)
            brain[2:-2, 3:-3, 2:-2] = 1
            volume = np.where(brain, 800.0, 50.0) + rng.normal(0, 10, shape)
            for folder, array, suffix in (
                ("T1", volume.astype(np.float32), "image"),
                ("label", brain, "label"),
            ):
                (base / name / folder).mkdir(parents=True, exist_ok=True)
                nib.save(
                    nib.Nifti1Image(array, np.eye(4)),
                    base / name / folder / f"{name}_{suffix}.nii.gz",
                )
            rows.append((patient, 0, split))
            patient += 1
    with (Path(root) / METADATA).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Patient ID", "Manufacturer", "Split"])
        writer.writerows(rows)
    return Path(root)
