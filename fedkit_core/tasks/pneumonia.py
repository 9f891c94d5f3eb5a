"""``pneumonia-cxr``: paediatric chest X-rays, pneumonia vs normal (FedHelp's classification).

Layout: Kaggle's ``chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}/*.jpeg``
(:mod:`~fedkit_core.tasks.classfolders`), read grey at 128 px. FedHelp's 2 large and 4
small clients are the named partition ``fedhelp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, SPLITS, TaskData
from fedkit_core.tasks import classfolders
from fedkit_core.tasks.spec import TaskSpec

LAYOUT = classfolders.FolderSet(
    channels=1,
    size=128,
    classes=("NORMAL", "PNEUMONIA"),
    names={"NORMAL": "normal", "PNEUMONIA": "pneumonia"},
)

SPEC = TaskSpec(
    name="pneumonia-cxr",
    description="paediatric chest X-ray pneumonia vs normal, 128 px grey (FedHelp)",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=classfolders.OPTIONS,
    defaults={"task.image_size": 128},
    needs_path=True,
    layout="chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}/*.jpeg",
    source=(
        "https://www.kaggle.com/datasets/paultimothymooney/chest-xray-pneumonia "
        "(Kermany et al., Cell 2018)"
    ),
    default_dir="pneumonia-cxr",
    markers=classfolders.MARKERS,
    partitions={  # FedHelp: 2 large and 4 small clients
        "fedhelp": {
            "partition.kind": "fractions",
            "clients": 6,
            "partition.fractions": [0.6, 0.2, 0.08, 0.06, 0.04, 0.02],
        }
    },
)


def load(config: Config) -> TaskData:
    return classfolders.load(config, SPEC, LAYOUT)


def write_fake(
    root: Path,
    per_class: int = 3,
    splits: Sequence[str] = SPLITS,
    classes: Sequence[str] = LAYOUT.classes,
) -> Path:
    """``chest_xray/<split>/<class>/*.jpeg`` grey images (``classes`` may add unexpected
    ones). Returns ``root``."""
    folder = Path(root) / "chest_xray"
    classfolders.write_fake_folders(folder, classes, per_class, splits, 1, ".jpeg")
    return Path(root)
