"""Tiny fake copies of the task zoo's data sets, in their exact on-disk layouts.

For tests (fedkit's and plugins'): each writer creates a few small files with the real
set's folder names, file formats (PNG/JPEG through PIL, NIfTI through nibabel, DICOM
through pydicom) and pixel conventions, and returns the folder to use as ``task.path``.
Contents encode their labels so tests can check that images and labels stay aligned:
a classification image's mean grey level is ``40 + 20 * label``; a segmentation image is
bright (200) inside its mask's foreground and dark (40) outside.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedkit_core.tasks import classfolders, prostate

PROSTATE_SITES = prostate.SITES
OCT_C8 = classfolders.OCT_C8.classes
KVASIR_V2 = classfolders.KVASIR_V2.classes
#: HyperKvasir's labeled-images tree: class -> its parent folders
HYPERKVASIR = {
    "cecum": "lower-gi-tract/anatomical-landmarks",
    "ileum": "lower-gi-tract/anatomical-landmarks",
    "retroflex-rectum": "lower-gi-tract/anatomical-landmarks",
    "hemorrhoids": "lower-gi-tract/pathological-findings",
    "polyps": "lower-gi-tract/pathological-findings",
    "ulcerative-colitis-grade-0-1": "lower-gi-tract/pathological-findings",
    "ulcerative-colitis-grade-1": "lower-gi-tract/pathological-findings",
    "ulcerative-colitis-grade-1-2": "lower-gi-tract/pathological-findings",
    "ulcerative-colitis-grade-2": "lower-gi-tract/pathological-findings",
    "ulcerative-colitis-grade-2-3": "lower-gi-tract/pathological-findings",
    "ulcerative-colitis-grade-3": "lower-gi-tract/pathological-findings",
    "bbps-0-1": "lower-gi-tract/quality-of-mucosal-views",
    "bbps-2-3": "lower-gi-tract/quality-of-mucosal-views",
    "impacted-stool": "lower-gi-tract/quality-of-mucosal-views",
    "dyed-lifted-polyps": "lower-gi-tract/therapeutic-interventions",
    "dyed-resection-margins": "lower-gi-tract/therapeutic-interventions",
    "pylorus": "upper-gi-tract/anatomical-landmarks",
    "retroflex-stomach": "upper-gi-tract/anatomical-landmarks",
    "z-line": "upper-gi-tract/anatomical-landmarks",
    "barretts": "upper-gi-tract/pathological-findings",
    "barretts-short-segment": "upper-gi-tract/pathological-findings",
    "esophagitis-a": "upper-gi-tract/pathological-findings",
    "esophagitis-b-d": "upper-gi-tract/pathological-findings",
}
RSNA_SUBTYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")


def _save(array: np.ndarray, path: Path, **kwargs) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **kwargs)


def _blob(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random ellipse (bool mask) well inside the image."""
    yy, xx = np.mgrid[:height, :width]
    cy, cx = rng.uniform(0.35, 0.65) * height, rng.uniform(0.35, 0.65) * width
    ry, rx = rng.uniform(0.15, 0.3) * height, rng.uniform(0.15, 0.3) * width
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def _seg_image(mask: np.ndarray) -> np.ndarray:
    return np.where(mask, 200, 40).astype(np.uint8)


def _class_image(rng: np.random.Generator, label: int, shape: tuple[int, ...]) -> np.ndarray:
    noise = rng.integers(-5, 6, shape)
    return np.clip(40 + 20 * label + noise, 0, 255).astype(np.uint8)


def prostate_slices(
    root: Path,
    sites: Sequence[str] = PROSTATE_SITES,
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
                organ = _blob(rng, size, size)
                name = f"{k // 2:02d}_{k % 2:02d}.png"
                _save(_seg_image(organ), base / site / split / "image" / name)
                _save(np.where(organ, 0, 255).astype(np.uint8), base / site / split / "mask" / name)
    return base


def prostate_volumes(
    root: Path,
    sites: Sequence[str] = ("BIDMC", "HK", "ISBI"),
    cases: int = 5,
    shape: tuple[int, int, int] = (20, 20, 6),
    seed: int = 0,
) -> Path:
    """``<site>/CaseNN.nii.gz`` + ``CaseNN_segmentation.nii.gz`` (``_Segmentation`` for HK);
    int16 MR intensities; the first and last slice of every case hold no prostate."""
    import nibabel as nib

    rng = np.random.default_rng(seed)
    base = Path(root)
    for site in sites:
        (base / site).mkdir(parents=True, exist_ok=True)
        ending = "_Segmentation" if site == "HK" else "_segmentation"
        for case in range(cases):
            mask = np.zeros(shape, np.uint8)
            for z in range(1, shape[2] - 1):
                mask[..., z] = _blob(rng, *shape[:2])
            volume = np.where(mask, 1500, 300).astype(np.int16) + rng.integers(0, 20, shape)
            affine = np.diag([0.6, 0.6, 3.0, 1.0])
            nib.save(
                nib.Nifti1Image(volume.astype(np.int16), affine),
                base / site / f"Case{case:02d}.nii.gz",
            )
            nib.save(nib.Nifti1Image(mask, affine), base / site / f"Case{case:02d}{ending}.nii.gz")
    return base


def fundus(root: Path, counts: dict[str, int] | None = None, size: int = 32, seed: int = 0) -> Path:
    """``Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}/*.png``: RGB images, RGB masks
    255 background, 128 optic disc, 0 cup; Domain2 with its file lists. Returns ``Fundus``."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "Fundus"
    prefixes = {1: "gdrishtiGS_", 2: "G-", 3: "g", 4: "V"}
    for d, prefix in prefixes.items():
        for split, n in (counts or {"train": 3, "test": 2}).items():
            for k in range(n):
                disc = _blob(rng, size, size)
                yy, xx = np.nonzero(disc)
                cup = np.zeros_like(disc)
                cy, cx = int(yy.mean()), int(xx.mean())
                cup[cy - 2 : cy + 3, cx - 2 : cx + 3] = True
                grey = np.where(cup, 0, np.where(disc, 128, 255)).astype(np.uint8)
                image = np.stack([np.where(disc, 200, 40)] * 3, -1).astype(np.uint8)
                image[cup] = 250
                name = f"{prefix}{k + 1:03d}-{split}.png"
                _save(image, base / f"Domain{d}" / split / "ROIs" / "image" / name)
                _save(
                    np.stack([grey] * 3, -1), base / f"Domain{d}" / split / "ROIs" / "mask" / name
                )
    (base / "Domain2" / "test_file_list.txt").write_text("G-1-test.jpg\n")
    (base / "readme.md").write_text("Domain1: Drishti-GS ...\n")
    return base


def ixi(
    root: Path,
    subjects: dict[str, tuple[int, int]] | None = None,
    shape: tuple[int, int, int] = (14, 16, 12),
    seed: int = 0,
) -> Path:
    """FLamby's ``IXI_sample/IXI<ID>-<centre>-<n>/{T1,label}/*.nii.gz`` and
    ``metadata_tiny.csv``; ``subjects``: centre -> (train, test) counts."""
    import nibabel as nib

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
    with (Path(root) / "metadata_tiny.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Patient ID", "Manufacturer", "Split"])
        writer.writerows(rows)
    return Path(root)


def isic2019(root: Path, per_centre: int = 4, seed: int = 0) -> Path:
    """FLamby's ``ISIC_2019_Training_Input_preprocessed/*.jpg`` (shorter side 32 here, widths
    vary) and its ``train_test_split`` csv; six centres, the last image of each is test."""
    rng = np.random.default_rng(seed)
    base = Path(root)
    classes = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK"]
    rows = []
    for centre in range(6):
        for k in range(per_centre):
            label = (centre + k) % 8
            name = f"ISIC_{centre * 1000 + k:07d}" + ("_downsampled" if centre == 4 else "")
            width = 32 + int(rng.integers(0, 12))
            _save(
                _class_image(rng, label, (32, width, 3)),
                base / "ISIC_2019_Training_Input_preprocessed" / f"{name}.jpg",
                quality=95,
            )
            fold = "test" if k == per_centre - 1 else "train"
            onehot = [float(c == label) for c in range(9)]
            rows.append([name, *onehot, label, centre, fold, f"{fold}_{centre}"])
    with (base / "train_test_split").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["image", *classes, "target", "center", "fold", "fold2"])
        writer.writerows(rows)
    return base


def class_folders(
    root: Path,
    classes: dict[str, str] | Sequence[str],
    per_class: int = 3,
    splits: Sequence[str] | None = None,
    channels: int = 3,
    suffix: str = ".jpg",
    size: tuple[int, int] = (30, 34),
    seed: int = 0,
) -> Path:
    """``root[/<split>]/<parents>/<class>/*<suffix>``; ``classes`` may map each class to
    parent folders (HyperKvasir). Labels are the sorted class names' positions."""
    rng = np.random.default_rng(seed)
    parents = classes if isinstance(classes, dict) else dict.fromkeys(classes, "")
    order = sorted(parents)
    shape = size if channels == 1 else (*size, 3)
    for split in splits or [""]:
        for name, parent in parents.items():
            for k in range(per_class):
                path = Path(root) / split / parent / name / f"{name}-{split}{k}{suffix}"
                _save(_class_image(rng, order.index(name), shape), path, quality=95)
    return Path(root)


def hyperkvasir(root: Path, per_class: int = 5) -> Path:
    """HyperKvasir's ``labeled-images/<tract>/<category>/<class>/*.jpg`` (23 classes) with
    its ``image-labels.csv``, inside a ``hyper-kvasir`` folder next to other image sets."""
    base = Path(root) / "hyper-kvasir"
    class_folders(base / "labeled-images", HYPERKVASIR, per_class=per_class)
    (base / "labeled-images" / "image-labels.csv").write_text(
        "Video file,Organ,Finding,Classification\n"
    )
    class_folders(base / "segmented-images", ["images"], per_class=2)
    return Path(root)


def rsna_ich(root: Path, fmt: str = "dcm", size: int = 24, seed: int = 0) -> Path:
    """The challenge's ``stage_2_train.csv`` (``ID_<hex>_<subtype>,Label`` rows, ``any`` too)
    and ``stage_2_train/ID_<hex>.dcm`` CT slices (or ``.png``). Per subtype, 3 images with
    only that subtype; plus 2 without haemorrhage and 2 with two subtypes (both dropped)."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "stage_2_train"
    folder.mkdir(parents=True, exist_ok=True)
    images = [(c,) for c in range(5) for _ in range(3)] + [(), (), (1, 4), (0, 3)]
    rows = []
    for k, positive in enumerate(images):
        ident = f"ID_{k:03x}{int(rng.integers(0, 16**6)):06x}"
        for s, subtype in enumerate(RSNA_SUBTYPES):
            rows.append((f"{ident}_{subtype}", int(s in positive)))
        rows.append((f"{ident}_any", int(bool(positive))))
        label = positive[0] if len(positive) == 1 else 0
        hu = np.full((size, size), 40.0 - 40 + 20 * label) + rng.normal(0, 1, (size, size))
        if fmt == "dcm":
            _write_dicom(folder / f"{ident}.dcm", hu)
        else:
            grey = np.clip((hu - 0.0) / 80.0, 0, 1) * 255
            _save(grey.round().astype(np.uint8), folder / f"{ident}.png")
    order = rng.permutation(len(rows))
    with (Path(root) / "stage_2_train.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["ID", "Label"])
        writer.writerows(rows[i] for i in order)
    return Path(root)


def _write_dicom(path: Path, hu: np.ndarray, intercept: float = -1024.0) -> None:
    """A minimal CT DICOM with int16 pixels ``hu - intercept``."""
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
    ds.Modality = "CT"
    ds.Rows, ds.Columns = hu.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.RescaleIntercept, ds.RescaleSlope = intercept, 1.0
    ds.PixelData = np.round(hu - intercept).astype(np.int16).tobytes()
    pydicom.dcmwrite(path, ds, enforce_file_format=True)


def lung_cxr(root: Path, per_source: int = 4, size: int = 40, seed: int = 0) -> Path:
    """``Lung Segmentation/CXR_png/`` and ``masks/`` (Montgomery ``MCUCXR_*.png`` with
    same-name masks, Shenzhen ``CHNCXR_*.png`` with ``*_mask.png``; masks 0/255), plus
    one unannotated image per source and the ``test/`` folder of unannotated images."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "Lung Segmentation"
    for prefix, ending in (("MCUCXR", ""), ("CHNCXR", "_mask")):
        for k in range(per_source + 1):
            name = f"{prefix}_{k:04d}_{k % 2}"
            lung = _blob(rng, size, size)
            _save(_seg_image(lung), base / "CXR_png" / f"{name}.png")
            if k < per_source:
                _save(
                    np.where(lung, 255, 0).astype(np.uint8), base / "masks" / f"{name}{ending}.png"
                )
    _save(np.zeros((size, size), np.uint8), base / "test" / "0001.png")
    return Path(root)


def medmnist(
    root: Path, flag: str = "breastmnist", n: int = 12, size: int = 28, seed: int = 0
) -> Path:
    """``<flag>.npz`` in MedMNIST's format (labels (N, 1); grey); 2 classes."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in (("train", n), ("val", n // 2), ("test", n // 2)):
        labels = np.arange(count) % 2
        arrays[f"{split}_images"] = np.stack(
            [_class_image(rng, int(y), (size, size)) for y in labels]
        )
        arrays[f"{split}_labels"] = labels[:, None].astype(np.uint8)
    path = Path(root) / (f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return Path(root)
