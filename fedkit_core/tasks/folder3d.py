"""``folder3d``: your own 3D volumes for classification, one folder per site and class.

The layout of :mod:`~fedkit_core.tasks.folder` (sites, optional split folders, class
folders, the same skipping rules and errors), where each sample is a volume: a NIfTI file
(``.nii``, ``.nii.gz``) or a DICOM series (a folder of ``.dcm`` slices, ordered along the
slice normal by ``ImagePositionPatient``, else by ``InstanceNumber``; rescale slope and
intercept applied). Each volume is scaled to 0-1 between its own 0.5 and 99.5 percentiles
(as ``prostate``), resized to ``task.image_size`` cubed (MONAI ``Resize``, default 48, as
``ixi``'s volumes) and stored as one channel (N, 1, S, S, S); the default model is the 3D
``cnn``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.errors import FedkitError
from fedkit_core.extras import require
from fedkit_core.tasks import files, folder
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import TaskSpec

VERSION = 1
SIZE = 48
NIFTI_SUFFIXES = (".nii", ".nii.gz")

SPEC = TaskSpec(
    name="folder3d",
    description="your 3D classification volumes as <site>/[<split>/]<class>/*.nii.gz or DICOM "
    "series folders, sites = clients",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=(CACHE_OPTION, AUGMENT_OPTION, TRANSFORMS_OPTION),
    defaults={"task.image_size": SIZE},
    needs_path=True,
    layout=(
        "<task.path>/<site>/[train|val|test/]<class>/<volume> (a .nii or .nii.gz file, or a "
        "folder of one DICOM series' .dcm files), or <task.path>/[train|val|test/]<class>/"
        "<volume> for a single site"
    ),
)


def is_nifti(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and name.endswith(NIFTI_SUFFIXES) and not name.startswith(".")


def dicom_files(folder: Path) -> list[Path]:
    """The ``.dcm`` files directly in ``folder``, sorted by name (hidden files ignored)."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.suffix.lower() == ".dcm" and not p.name.startswith(".")
    )


def list_volumes(folder: Path) -> list[Path]:
    """The volumes directly in ``folder``: NIfTI files and DICOM series folders, by name."""
    if not folder.is_dir():
        return []
    series = [sub for sub in files.subdirs(folder) if dicom_files(sub)]
    return sorted([p for p in folder.iterdir() if is_nifti(p)] + series)


VOLUMES = folder.Samples("volumes", list_volumes)


def load(config: Config) -> TaskData:
    """The sites, splits and classes of volumes found under ``task.path``."""
    opts = config.section("task")
    root = Path(config["task.path"])
    classes, items = folder.discover(SPEC, root, VOLUMES)
    volumes = [p for splits in items.values() for entries in splits.values() for p, _ in entries]
    inputs = [f for p in volumes for f in (dicom_files(p) if p.is_dir() else [p])]
    size = opts["image_size"] or SIZE

    def build() -> TaskData:
        sites = {
            site: {split: _decode(entries, size) for split, entries in splits.items()}
            for site, splits in items.items()
        }
        return TaskData(CLASSIFICATION, classes, sites, has_sites=len(sites) > 1)

    data = cached(SPEC.name, VERSION, root, inputs, {"size": size}, build, opts["cache"])
    return attach(data, opts["augment"], opts["transforms"])


def _decode(entries: list[tuple[Path, int]], size: int) -> Split:
    volumes = files.parallel_map(lambda entry: _volume(entry[0], size), entries)
    labels = np.array([label for _, label in entries], dtype=np.int64)
    return Split(torch.from_numpy(np.stack(volumes)), torch.from_numpy(labels))


def _volume(path: Path, size: int) -> np.ndarray:
    """(1, S, S, S) float32 in [0, 1]: the volume at ``path`` scaled between its 0.5 and
    99.5 percentiles and resized."""
    require("monai", "task folder3d", "nifti")
    from monai.transforms import Resize, ScaleIntensityRangePercentiles

    volume = read_dicom_series(path) if path.is_dir() else read_nifti(path)
    scale = ScaleIntensityRangePercentiles(lower=0.5, upper=99.5, b_min=0.0, b_max=1.0, clip=True)
    volume = Resize((size,) * 3)(scale(volume[None]))
    return np.asarray(volume, dtype=np.float32)


def read_nifti(path: Path) -> np.ndarray:
    """A NIfTI file's 3D voxels (float32); a trailing axis of length 1 is dropped."""
    nib = require("nibabel", "task folder3d (NIfTI volumes)", "nifti")
    try:
        volume = np.asarray(nib.load(path).dataobj, dtype=np.float32)
    except Exception as err:  # nibabel raises several kinds for a damaged file
        raise FedkitError(f"cannot read {path} as a NIfTI volume: {err}") from None
    volume = volume[..., 0] if volume.ndim == 4 and volume.shape[-1] == 1 else volume
    if volume.ndim != 3:
        raise FedkitError(f"{path} holds a {volume.ndim}D array {volume.shape}, not a 3D volume")
    return _finite(volume, path)


def read_dicom_series(folder: Path) -> np.ndarray:
    """One DICOM series' slices stacked (slices, rows, columns), float32 after rescaling."""
    pydicom = require("pydicom", "task folder3d (DICOM series)", "dicom")
    slices = []
    for path in dicom_files(folder):
        try:
            ds = pydicom.dcmread(path)
            pixels = ds.pixel_array.astype(np.float32)
        except Exception as err:  # pydicom raises several kinds for a damaged file
            raise FedkitError(f"cannot read {path} as a DICOM image: {err}") from None
        slope = float(getattr(ds, "RescaleSlope", 1.0))
        intercept = float(getattr(ds, "RescaleIntercept", 0.0))
        slices.append((_slice_position(ds), path, pixels * slope + intercept))
    shapes = sorted({s[2].shape for s in slices})
    if len(shapes) > 1:
        raise FedkitError(
            f"DICOM series {folder} mixes slice shapes {shapes}: one series per folder"
        )
    slices.sort(key=lambda s: (s[0], s[1].name))
    return _finite(np.stack([s[2] for s in slices]), folder)


def _slice_position(ds) -> float:
    """Where a slice lies: its position along the slice normal, else its InstanceNumber."""
    position = getattr(ds, "ImagePositionPatient", None)
    orientation = getattr(ds, "ImageOrientationPatient", None)
    if position is not None and orientation is not None:
        normal = np.cross(np.asarray(orientation[:3], float), np.asarray(orientation[3:], float))
        return float(np.dot(normal, np.asarray(position, float)))
    return float(getattr(ds, "InstanceNumber", 0) or 0)


def _finite(volume: np.ndarray, path: Path) -> np.ndarray:
    if not np.isfinite(volume).all():
        raise FedkitError(f"{path} holds voxel values that are not finite (NaN or infinity)")
    return volume


def write_fake(
    root: Path,
    sites: Sequence[str] = ("a", "b"),
    classes: Sequence[str] = ("healthy", "lesion"),
    per_class: int = 3,
    shape: tuple[int, int, int] = (12, 12, 12),
    seed: int = 0,
) -> Path:
    """``root/<site>/<class>/*.nii.gz`` noise volumes; those of label k (the sorted classes'
    position) hold a centre blob 200 * k brighter (label 0: none). Returns ``root``."""
    nib = require("nibabel", "writing NIfTI files", "nifti")
    rng = np.random.default_rng(seed)
    order = sorted(classes)
    centre = tuple(slice(d // 3, d - d // 3) for d in shape)
    for site in sites:
        for name in classes:
            target = Path(root) / site / name
            target.mkdir(parents=True, exist_ok=True)
            for k in range(per_class):
                volume = rng.normal(100.0, 10.0, shape)
                volume[centre] += 200.0 * order.index(name)
                nib.save(
                    nib.Nifti1Image(volume.astype(np.float32), np.eye(4)), target / f"{k}.nii.gz"
                )
    return Path(root)
