"""``rsna-ich``: intracranial haemorrhage subtype classification (RSNA 2019), FCA's setting.

Layout (the Kaggle challenge's): a label csv (``stage_2_train.csv`` or ``stage_1_train.csv``:
``ID,Label`` rows such as ``ID_12cadc6af_epidural,0``, one per image and subtype; a wide
csv with an image column ``ID``/``Image`` and one 0/1 column per subtype works too) and a
folder of the images named ``ID_<hex>.dcm`` (DICOM, read with pydicom) or the same names
as ``.png``/``.jpg`` (already windowed). As in FCA, only images with exactly one
haemorrhage subtype are kept (67,969 in the challenge's stage 2 training set) and resized
to ``task.image_size`` (default 128) grey; DICOM images are windowed to
``task.window`` = [centre, width] Hounsfield units (default the brain window 40/80).

Classes in FCA's order: 0 epidural, 1 intraparenchymal, 2 intraventricular,
3 subarachnoid, 4 subdural. The source hospitals are unknown, so clients come from a
partitioner; FCA's splits are the named partitions ``split1`` and ``split2``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError
from fedkit_core.tasks import fakes, files
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import TaskSpec

VERSION = 1
SUBTYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")
LABEL_FILES = ("stage_2_train.csv", "stage_1_train.csv")
IMAGE_SUFFIXES = (".dcm", ".png", ".jpg", ".jpeg")
NATIVE_SIZE = 128

SPEC = TaskSpec(
    name="rsna-ich",
    description="RSNA intracranial haemorrhage, single-subtype CT, 5 classes, 128 px (FCA)",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=(
        CACHE_OPTION,
        AUGMENT_OPTION,
        TRANSFORMS_OPTION,
        Option("window", "list[float]", [40.0, 80.0], "DICOM window [centre, width] in HU"),
        Option("labels", str, None, "label csv (default: stage_2_train.csv in task.path)"),
        Option("images", str, None, "image folder (default: the one holding the images)"),
    ),
    defaults={"task.image_size": 128},
    needs_path=True,
    layout=(
        "stage_2_train.csv (ID,Label rows like ID_<hex>_epidural,0) and a folder of "
        "ID_<hex>.dcm (or .png/.jpg) images, as the Kaggle challenge ships them"
    ),
    source=(
        "https://www.kaggle.com/competitions/rsna-intracranial-hemorrhage-detection "
        "(Flanders et al., Radiology: AI 2020)"
    ),
    default_dir="rsna-ich",
    markers=("*.csv", "*/*.csv"),
    partitions={
        # FCA's split 1: 5 clients, Dirichlet 0.5 for the minority class (epidural), 50 for
        # the others; alphas in the class order of SUBTYPES
        "split1": {
            "partition.kind": "class-dirichlet",
            "clients": 5,
            "partition.alphas": [0.5, 50.0, 50.0, 50.0, 50.0],
            "partition.drop_prob": 0.0,
        },
        # FCA's split 2: 10 clients, subdural 50, subarachnoid 30, intraventricular 10,
        # intraparenchymal 5, epidural 0.5; each class removed from a client w.p. 0.3
        "split2": {
            "partition.kind": "class-dirichlet",
            "clients": 10,
            "partition.alphas": [0.5, 5.0, 10.0, 30.0, 50.0],
            "partition.drop_prob": 0.3,
        },
    },
)


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    table = _label_file(root, opts["labels"])
    labels = _single_type(_read_labels(table))
    if not labels:
        raise SPEC.layout_error(root, f"{table.name} lists no image with exactly one subtype")
    folder = _image_folder(root, opts["images"], labels)
    by_id = _index(folder)
    ids = [i for i in labels if i in by_id]
    if len(ids) < len(labels):
        files.warn(f"rsna-ich: {len(labels) - len(ids)} labelled images are not in {folder}")
    size = opts["image_size"] or NATIVE_SIZE
    window = tuple(opts["window"])
    if len(window) != 2 or window[1] <= 0:
        raise FedkitError(f"task.window must be [centre, width > 0] in HU, got {list(window)}")
    paths = [by_id[i] for i in ids]

    def build() -> TaskData:
        images = np.empty((len(paths), 1, size, size), np.uint8)

        def fill(k: int) -> None:
            images[k] = _read(paths[k], size, window)

        files.parallel_map(fill, range(len(paths)))
        targets = torch.tensor([labels[i] for i in ids], dtype=torch.int64)
        split = Split(torch.from_numpy(images), targets)
        return TaskData(
            kind=CLASSIFICATION,
            class_names=list(SUBTYPES),
            sites={"all": {"train": split}},
            has_sites=False,
        )

    params = {"size": size, "window": window}
    data = cached(SPEC.name, VERSION, folder, [table, *paths], params, build, opts["cache"])
    return attach(data, opts["augment"], opts["transforms"])


def _under(root: Path, given: str) -> Path:
    """A user-given path: ``~`` expanded, relative ones taken under the data set's root."""
    path = Path(given).expanduser()
    return path if path.is_absolute() else root / path


def _label_file(root: Path, given: str | None) -> Path:
    if given:
        path = _under(root, given)
        if not path.is_file():
            raise SPEC.layout_error(root, f"task.labels={given} is not a file")
        return path
    for name in LABEL_FILES:
        found = sorted(root.glob(name)) + sorted(root.glob(f"*/{name}"))
        if found:
            return found[0]
    found = sorted(root.glob("*.csv"))
    if len(found) == 1:
        return found[0]
    raise SPEC.layout_error(
        root, f"found no label csv ({' or '.join(LABEL_FILES)}); set task.labels=FILE"
    )


def _read_labels(table: Path) -> dict[str, list[int]]:
    """Image id -> 0/1 per subtype, from the long (``ID,Label``) or the wide format.

    Streams the rows: the challenge's csv has 4.5 million of them.
    """
    with table.open(newline="") as fh:
        reader = csv.reader(fh)
        header = [c.strip().lower() for c in next(reader, [])]
        if {"id", "label"} <= set(header) and not set(SUBTYPES) <= set(header):
            id_col, label_col = header.index("id"), header.index("label")
            out: dict[str, list[int]] = {}
            for row in reader:
                image, _, subtype = row[id_col].rpartition("_")
                if subtype in SUBTYPES:
                    flags = out.setdefault(image, [0] * len(SUBTYPES))
                    flags[SUBTYPES.index(subtype)] = int(float(row[label_col]))
            return out
        key = next(
            (header.index(c) for c in ("id", "image", "image_id", "filename") if c in header), None
        )
        if key is None or not set(SUBTYPES) <= set(header):
            raise SPEC.layout_error(
                table,
                f"{table.name}: expected columns ID,Label (Kaggle format) or an image "
                f"column and the columns {', '.join(SUBTYPES)}",
            )
        columns = [header.index(s) for s in SUBTYPES]
        return {
            Path(row[key].strip()).name.split(".")[0]: [int(float(row[c])) for c in columns]
            for row in reader
            if row
        }


def _single_type(labels: dict[str, list[int]]) -> dict[str, int]:
    """Images with exactly one subtype -> its class index (sorted by id)."""
    return {i: v.index(1) for i, v in sorted(labels.items()) if sum(v) == 1}


def _index(folder: Path) -> dict[str, Path]:
    with os.scandir(folder) as entries:
        paths = [Path(e.path) for e in entries if e.is_file()]
    return {p.stem: p for p in paths if p.suffix.lower() in IMAGE_SUFFIXES}


def _image_folder(root: Path, given: str | None, labels: dict[str, int]) -> Path:
    if given:
        folder = _under(root, given)
        if not folder.is_dir():
            raise SPEC.layout_error(root, f"task.images={given} is not a folder")
        return folder
    wanted = set(list(labels)[:200])
    best, hits = None, 0
    for folder in [root, *files.subdirs(root)]:
        found = len(wanted & set(_index(folder)))
        if found > hits:
            best, hits = folder, found
    if best is None:
        raise SPEC.layout_error(
            root,
            "found no folder holding the labelled images (ID_<hex>.dcm/.png/.jpg); "
            "set task.images=FOLDER",
        )
    return best


def _read(path: Path, size: int, window: Sequence[float]) -> np.ndarray:
    if path.suffix.lower() != ".dcm":
        return files.read_image(path, 1, size)
    from PIL import Image

    hu = dicom_hounsfield(path)
    centre, width = window
    grey = np.clip((hu - (centre - width / 2)) / width, 0.0, 1.0) * 255.0
    im = Image.fromarray(grey.astype(np.float32)).resize((size, size), Image.Resampling.BILINEAR)
    return np.clip(np.asarray(im).round(), 0, 255).astype(np.uint8)[None]


def dicom_hounsfield(path: Path) -> np.ndarray:
    """A CT slice in Hounsfield units.

    Some of the challenge's scans store 12-bit unsigned pixels with a wrong intercept
    (intercept > -100); those are shifted back to the usual -1000 HU offset.
    """
    try:
        import pydicom
    except ImportError:
        raise FedkitError(
            "reading the RSNA DICOM files needs pydicom: pip install 'fedkit[dicom]' "
            "(or convert the images to PNG)"
        ) from None
    dcm = pydicom.dcmread(path)
    pixels = dcm.pixel_array.astype(np.float32)
    slope = float(getattr(dcm, "RescaleSlope", 1.0))
    intercept = float(getattr(dcm, "RescaleIntercept", 0.0))
    if (
        getattr(dcm, "BitsStored", 16) == 12
        and getattr(dcm, "PixelRepresentation", 1) == 0
        and intercept > -100
    ):
        pixels = pixels + 1000.0
        pixels[pixels >= 4096] -= 4096
        intercept = -1000.0
    return pixels * slope + intercept


def write_fake(root: Path, fmt: str = "dcm", size: int = 24, seed: int = 0) -> Path:
    """The challenge's ``stage_2_train.csv`` (``ID_<hex>_<subtype>,Label`` rows, ``any`` too)
    and ``stage_2_train/ID_<hex>.dcm`` CT slices of ``20 * label`` HU (or ``.png``, windowed).
    Per subtype, 3 images with only that subtype; plus 2 without haemorrhage and 2 with two
    subtypes (both dropped by the loader). Returns ``root``."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "stage_2_train"
    folder.mkdir(parents=True, exist_ok=True)
    images = [(c,) for c in range(len(SUBTYPES)) for _ in range(3)] + [(), (), (1, 4), (0, 3)]
    rows = []
    for k, positive in enumerate(images):
        ident = f"ID_{k:03x}{int(rng.integers(0, 16**6)):06x}"
        for s, subtype in enumerate(SUBTYPES):
            rows.append((f"{ident}_{subtype}", int(s in positive)))
        rows.append((f"{ident}_any", int(bool(positive))))
        label = positive[0] if len(positive) == 1 else 0
        hu = np.full((size, size), 20.0 * label) + rng.normal(0, 1, (size, size))
        if fmt == "dcm":
            write_fake_dicom(folder / f"{ident}.dcm", hu)
        else:
            grey = np.clip(hu / 80.0, 0, 1) * 255
            fakes.save_image(grey.round().astype(np.uint8), folder / f"{ident}.png")
    order = rng.permutation(len(rows))
    with (Path(root) / LABEL_FILES[0]).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["ID", "Label"])
        writer.writerows(rows[i] for i in order)
    return Path(root)


def write_fake_dicom(path: Path, hu: np.ndarray, intercept: float = -1024.0) -> None:
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
