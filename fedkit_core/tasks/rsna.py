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
from fedkit_core.errors import FedkitError
from fedkit_core.tasks import files
from fedkit_core.tasks.augment import attach
from fedkit_core.tasks.base import CLASSIFICATION, Split, TaskData
from fedkit_core.tasks.cache import cached

NAME = "rsna-ich"
VERSION = 1
SUBTYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")
LABEL_FILES = ("stage_2_train.csv", "stage_1_train.csv")
IMAGE_SUFFIXES = (".dcm", ".png", ".jpg", ".jpeg")
NATIVE_SIZE = 128


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    table = _label_file(root, opts["labels"])
    labels = _single_type(_read_labels(table))
    if not labels:
        raise files.layout_error(
            NAME, root, f"{table.name} lists no image with exactly one subtype"
        )
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
    data = cached(NAME, VERSION, folder, [table, *paths], params, build, opts["cache"])
    return attach(data, opts["augment"])


def _under(root: Path, given: str) -> Path:
    """A user-given path: ``~`` expanded, relative ones taken under the data set's root."""
    path = Path(given).expanduser()
    return path if path.is_absolute() else root / path


def _label_file(root: Path, given: str | None) -> Path:
    if given:
        path = _under(root, given)
        if not path.is_file():
            raise files.layout_error(NAME, root, f"task.labels={given} is not a file")
        return path
    for name in LABEL_FILES:
        found = sorted(root.glob(name)) + sorted(root.glob(f"*/{name}"))
        if found:
            return found[0]
    found = sorted(root.glob("*.csv"))
    if len(found) == 1:
        return found[0]
    raise files.layout_error(
        NAME, root, f"found no label csv ({' or '.join(LABEL_FILES)}); set task.labels=FILE"
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
            raise files.layout_error(
                NAME,
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
            raise files.layout_error(NAME, root, f"task.images={given} is not a folder")
        return folder
    wanted = set(list(labels)[:200])
    best, hits = None, 0
    for folder in [root, *files.subdirs(root)]:
        found = len(wanted & set(_index(folder)))
        if found > hits:
            best, hits = folder, found
    if best is None:
        raise files.layout_error(
            NAME,
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
