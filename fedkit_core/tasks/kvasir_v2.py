"""``kvasir-v2``: Kvasir v2 GI endoscopy images in 8 classes (FedCB).

Layout: ``kvasir-dataset-v2/<class>/*.jpg`` (:mod:`~fedkit_core.tasks.classfolders`),
optionally inside split folders; without them ``task.fold`` picks the stratified test
fold. FedCB's splits are the named partitions ``fedcb-0.05`` and ``fedcb-0.1`` (10 clients).
"""

from __future__ import annotations

from pathlib import Path

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, TaskData
from fedkit_core.tasks import classfolders
from fedkit_core.tasks.spec import TaskSpec, fedcb_partitions

LAYOUT = classfolders.FolderSet(
    channels=3,
    size=128,
    classes=(
        "dyed-lifted-polyps",
        "dyed-resection-margins",
        "esophagitis",
        "normal-cecum",
        "normal-pylorus",
        "normal-z-line",
        "polyps",
        "ulcerative-colitis",
    ),
)

SPEC = TaskSpec(
    name="kvasir-v2",
    description="Kvasir v2 GI endoscopy, 8 classes, 128 px (FedCB)",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=classfolders.OPTIONS,
    defaults={"task.image_size": 128},
    needs_path=True,
    layout=(
        "kvasir-dataset-v2/<class>/*.jpg (dyed-lifted-polyps, dyed-resection-margins, "
        "esophagitis, normal-cecum, normal-pylorus, normal-z-line, polyps, "
        "ulcerative-colitis), optionally inside {train,val,test}/ folders"
    ),
    source="https://datasets.simula.no/kvasir/ (Pogorelov et al., MMSys 2017)",
    default_dir="kvasir-v2",
    markers=classfolders.MARKERS,
    partitions=fedcb_partitions(clients=10),
)


def load(config: Config) -> TaskData:
    return classfolders.load(config, SPEC, LAYOUT)


def write_fake(root: Path, per_class: int = 5) -> Path:
    """``kvasir-dataset-v2/<class>/*.jpg`` RGB images, no split folders. Returns ``root``."""
    classfolders.write_fake_folders(Path(root) / "kvasir-dataset-v2", LAYOUT.classes, per_class)
    return Path(root)
