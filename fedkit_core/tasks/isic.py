"""``isic2019``: Fed-ISIC2019 (FLamby): dermoscopy in 8 classes from six centres = clients.

Layout (FLamby's ``fed_isic2019`` after its download and ``resize_images.py`` scripts):
``ISIC_2019_Training_Input_preprocessed/<image>.jpg`` (shorter side 224 px, colour
constancy applied) and FLamby's ``train_test_split`` csv (columns ``image``, ``target``,
``center``, ``fold`` = train/test) beside it. The centres keep FLamby's official split
(train/test 9930/2483, 3163/791, 2691/672, 1807/452, 655/164, 351/88). Images are scaled
so the shorter side is ``task.image_size`` (default 224) and centre-cropped to a square.
"""

from __future__ import annotations

import csv
from itertools import groupby
from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.tasks import fakes, files
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import TaskSpec

VERSION = 1
IMAGES_DIR = "ISIC_2019_Training_Input_preprocessed"
SPLIT_FILE = "train_test_split"
#: FLamby's centre ids 0-5
CENTRES = (
    "BCN",
    "HAM_vidir_molemax",
    "HAM_vidir_modern",
    "HAM_rosendahl",
    "MSK",
    "HAM_vienna_dias",
)
#: the csv's one-hot columns MEL, NV, BCC, AK, BKL, DF, VASC, SCC in label order
CLASSES = (
    "melanoma",
    "melanocytic nevus",
    "basal cell carcinoma",
    "actinic keratosis",
    "benign keratosis",
    "dermatofibroma",
    "vascular lesion",
    "squamous cell carcinoma",
)
NATIVE_SIZE = 224

SPEC = TaskSpec(
    name="isic2019",
    description="Fed-ISIC2019 dermoscopy, 8 classes, six centres with FLamby's split, 224 px",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=(CACHE_OPTION, AUGMENT_OPTION, TRANSFORMS_OPTION),
    defaults={"task.image_size": 224},
    needs_path=True,
    layout=(
        "ISIC_2019_Training_Input_preprocessed/<image>.jpg and FLamby's train_test_split csv "
        "(columns image, target, center, fold) beside it"
    ),
    source=(
        "FLamby's fed_isic2019 scripts (https://github.com/owkin/FLamby/tree/main/flamby/"
        "datasets/fed_isic2019) over https://challenge.isic-archive.com/data/"
    ),
    default_dir="isic2019",
    markers=(IMAGES_DIR, f"*/{IMAGES_DIR}"),
)


def load(config: Config) -> TaskData:
    opts = config.section("task")
    root = Path(config["task.path"])
    base = files.find_dir(root, lambda d: (d / IMAGES_DIR).is_dir())
    if base is None:
        raise SPEC.layout_error(root, f"found no {IMAGES_DIR}/ folder")
    table = _split_table(root, base)
    # grouped by centre and split, so that each client's split is one slice of the array
    rows = sorted(_read_rows(table), key=lambda r: (int(r["center"]), r["fold"] != "train"))
    folder = base / IMAGES_DIR
    paths = [folder / f"{row['image']}.jpg" for row in rows]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise SPEC.layout_error(
            root,
            f"{len(missing)} images listed in {table.name} are not in {folder} "
            f"(e.g. {', '.join(missing[:3])})",
        )
    size = opts["image_size"] or NATIVE_SIZE

    def build() -> TaskData:
        images = torch.from_numpy(files.read_images(paths, 3, size, "crop"))
        targets = torch.tensor([int(r["target"]) for r in rows], dtype=torch.int64)
        sites: dict[str, dict[str, Split]] = {}
        start = 0
        for (centre, fold), group in groupby(rows, key=lambda r: (int(r["center"]), r["fold"])):
            end = start + len(list(group))
            name = CENTRES[centre] if centre < len(CENTRES) else f"centre{centre}"
            sites.setdefault(name, {})[fold] = Split(images[start:end], targets[start:end])
            start = end
        return TaskData(kind=CLASSIFICATION, class_names=list(CLASSES), sites=sites)

    data = cached(SPEC.name, VERSION, base, [table, *paths], {"size": size}, build, opts["cache"])
    return attach(data, opts["augment"], opts["transforms"])


def _split_table(root: Path, base: Path) -> Path:
    for folder in dict.fromkeys([base, root, base.parent]):
        found = sorted(folder.glob(f"{SPLIT_FILE}*"))
        if found:
            return found[0]
    raise SPEC.layout_error(
        root,
        f"found no {SPLIT_FILE} csv beside {IMAGES_DIR}/ (FLamby ships it as "
        "flamby/datasets/fed_isic2019/dataset_creation_scripts/train_test_split)",
    )


def _read_rows(table: Path) -> list[dict[str, str]]:
    with table.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    need = {"image", "target", "center", "fold"}
    have = set(rows[0]) if rows else set()
    if not need <= have:
        raise SPEC.layout_error(
            table,
            f"{table.name} lacks the columns {sorted(need - have)} (has {sorted(have)})",
        )
    bad = sorted({r["fold"] for r in rows} - {"train", "test"})
    if bad:
        raise SPEC.layout_error(table, f"{table.name}: fold values {bad}, expected train/test")
    return rows


def write_fake(root: Path, per_centre: int = 4, seed: int = 0) -> Path:
    """FLamby's ``ISIC_2019_Training_Input_preprocessed/*.jpg`` (shorter side 32 here, widths
    vary) and its ``train_test_split`` csv; six centres, the last image of each is test.
    Returns ``root``."""
    rng = np.random.default_rng(seed)
    base = Path(root)
    columns = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK"]
    rows = []
    for centre in range(len(CENTRES)):
        for k in range(per_centre):
            label = (centre + k) % len(CLASSES)
            name = f"ISIC_{centre * 1000 + k:07d}" + ("_downsampled" if centre == 4 else "")
            width = 32 + int(rng.integers(0, 12))
            fakes.save_image(
                fakes.class_image(rng, label, (32, width, 3)),
                base / IMAGES_DIR / f"{name}.jpg",
                quality=95,
            )
            fold = "test" if k == per_centre - 1 else "train"
            onehot = [float(c == label) for c in range(len(columns))]
            rows.append([name, *onehot, label, centre, fold, f"{fold}_{centre}"])
    with (base / SPLIT_FILE).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["image", *columns, "target", "center", "fold", "fold2"])
        writer.writerows(rows)
    return base
