"""``oct-c8``: OCT-C8 retinal OCT scans in 8 classes, train/val/test folders (FedCB).

Layout: ``{train,val,test}/<class>/*.jpg`` (:mod:`~fedkit_core.tasks.classfolders`), read
grey at 128 px; the class names spell out the abbreviations for methods that prompt a
language model with them. FedCB's splits are the named partitions ``fedcb-0.05`` and
``fedcb-0.1`` (12 clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, SPLITS, TaskData
from fedkit_core.tasks import classfolders
from fedkit_core.tasks.spec import TaskSpec, fedcb_partitions

LAYOUT = classfolders.FolderSet(
    channels=1,
    size=128,
    classes=("AMD", "CNV", "CSR", "DME", "DR", "DRUSEN", "MH", "NORMAL"),
    names={
        "AMD": "age-related macular degeneration",
        "CNV": "choroidal neovascularization",
        "CSR": "central serous retinopathy",
        "DME": "diabetic macular edema",
        "DR": "diabetic retinopathy",
        "DRUSEN": "drusen",
        "MH": "macular hole",
        "NORMAL": "healthy",
    },
)

SPEC = TaskSpec(
    name="oct-c8",
    description="OCT-C8 retinal OCT, 8 classes, train/val/test folders, 128 px grey (FedCB)",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=classfolders.OPTIONS,
    defaults={"task.image_size": 128},
    needs_path=True,
    layout="{train,val,test}/{AMD,CNV,CSR,DME,DR,DRUSEN,MH,NORMAL}/*.jpg",
    source="https://www.kaggle.com/datasets/obulisainaren/retinal-oct-c8",
    default_dir="oct-c8",
    markers=classfolders.MARKERS,
    partitions=fedcb_partitions(clients=12),
)


def load(config: Config) -> TaskData:
    return classfolders.load(config, SPEC, LAYOUT)


def write_fake(root: Path, per_class: int = 3, splits: Sequence[str] = SPLITS) -> Path:
    """``RetinalOCT_Dataset/<split>/<class>/*.jpg`` grey images. Returns ``root``."""
    classfolders.write_fake_folders(
        Path(root) / "RetinalOCT_Dataset", LAYOUT.classes, per_class, splits, channels=1
    )
    return Path(root)
