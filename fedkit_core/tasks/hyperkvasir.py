"""``hyperkvasir``: HyperKvasir's labeled GI endoscopy images, 23 long-tailed classes (Fed-MAS).

Layout: ``labeled-images/<tract>/<category>/<class>/*.jpg``, read as a nested tree of class
folders (:mod:`~fedkit_core.tasks.classfolders`); without split folders, ``task.fold``
picks the stratified test fold. Fed-MAS's shot groups: head classes have more than 700
training images, tail classes fewer than 70.
"""

from __future__ import annotations

from pathlib import Path

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, TaskData
from fedkit_core.tasks import classfolders
from fedkit_core.tasks.spec import TaskSpec

#: the class folders of ``labeled-images`` -> the folders above them
FOLDERS = {
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
LAYOUT = classfolders.FolderSet(
    channels=3,
    size=224,
    classes=tuple(sorted(FOLDERS)),
    names={"barretts": "barrett's esophagus", "barretts-short-segment": "short-segment barrett's"},
)

SPEC = TaskSpec(
    name="hyperkvasir",
    description="HyperKvasir GI endoscopy, 23 long-tailed classes, head/medium/tail, 224 px",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=classfolders.OPTIONS,
    # Fed-MAS's shot groups: head > 700 training images, tail < 70
    defaults={"task.image_size": 224, "task.shot_thresholds": [700, 70]},
    needs_path=True,
    layout=(
        "labeled-images/<tract>/<category>/<class>/*.jpg (the 23 class folders of "
        "HyperKvasir's labeled images, e.g. lower-gi-tract/pathological-findings/polyps)"
    ),
    source="https://datasets.simula.no/hyper-kvasir/ (Borgli et al., Sci. Data 2020)",
    default_dir="hyperkvasir",
    markers=(*classfolders.MARKERS, "*/*/*/*/*.jpg"),
)


def load(config: Config) -> TaskData:
    return classfolders.load(config, SPEC, LAYOUT)


def write_fake(root: Path, per_class: int = 5) -> Path:
    """HyperKvasir's ``labeled-images/<tract>/<category>/<class>/*.jpg`` (23 classes) with
    its ``image-labels.csv``, inside a ``hyper-kvasir`` folder next to another image set.
    Returns ``root``."""
    base = Path(root) / "hyper-kvasir"
    classfolders.write_fake_folders(base / "labeled-images", FOLDERS, per_class=per_class)
    (base / "labeled-images" / "image-labels.csv").write_text(
        "Video file,Organ,Finding,Classification\n"
    )
    classfolders.write_fake_folders(base / "segmented-images", ["images"], per_class=2)
    return Path(root)
