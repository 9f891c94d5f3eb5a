"""``medmnist``: any 2D MedMNIST v2 / MedMNIST+ data set through the ``medmnist`` package.

``task.flag`` picks the data set (``pneumoniamnist``, ``retinamnist``, ...) and
``task.npz_size`` its resolution (28, or MedMNIST+'s 64, 128, 224). The file
``<flag>.npz`` (``<flag>_<size>.npz`` above 28 px) is read from ``task.path``, a folder
(or the file itself); it is downloaded there only with ``task.download=true``. Class
names and the task type come from ``medmnist.INFO``; multi-label (chestmnist) and 3D
flags are refused, since fedkit's tasks are single-label 2D or segmentation. The files
are already decoded arrays, so no cache is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError, unknown
from fedkit_core.tasks import fakes
from fedkit_core.tasks.npz import classification_file
from fedkit_core.tasks.spec import TaskSpec

SPEC = TaskSpec(
    name="medmnist",
    description="any 2D MedMNIST data set by flag (task.flag=pneumoniamnist), via medmnist",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=(
        Option("flag", str, "pneumoniamnist", "the MedMNIST data set (medmnist.INFO key)"),
        Option("npz_size", int, 28, "MedMNIST+ resolution of the file", choices=(28, 64, 128, 224)),
        Option("download", bool, False, "download the file into task.path when absent"),
    ),
    needs_path=True,
    layout=(
        "a folder holding <flag>.npz (or <flag>_<size>.npz for MedMNIST+), as medmnist "
        "downloads it; create the folder and set task.download=true to fetch the file"
    ),
    source="https://medmnist.com (Yang et al., Sci. Data 2023; files CC BY 4.0)",
    default_dir="medmnist",
)


def info(flag: str) -> dict[str, Any]:
    """``medmnist.INFO[flag]``, or a FedkitError saying how to get it."""
    try:
        from medmnist.info import INFO
    except ImportError:
        raise FedkitError(
            "task medmnist needs the medmnist package: pip install 'fedkit[medmnist]'"
        ) from None
    if flag not in INFO:
        raise unknown("MedMNIST flag", flag, INFO)
    meta = dict(INFO[flag])
    if flag.endswith("3d"):
        raise FedkitError(f"task.flag={flag} is a 3D MedMNIST set; fedkit reads the 2D ones")
    if meta["task"].startswith("multi-label"):
        raise FedkitError(f"task.flag={flag} is multi-label ({meta['task']}); pick a 2D flag")
    return meta


def file_name(flag: str, size: int) -> str:
    return f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"


def load(config: Config) -> TaskData:
    opts = config.section("task")
    flag, size = opts["flag"], opts["npz_size"]
    meta = info(flag)
    root = Path(config["task.path"])
    path = root if root.is_file() else root / file_name(flag, size)
    if not path.is_file():
        if not opts["download"]:
            raise SPEC.layout_error(
                root,
                f"{path.name} is not there; set task.download=true to fetch it "
                f"from {meta['url'] if size == 28 else meta[f'url_{size}']}",
            )
        _download(flag, size, root)
    data = classification_file(path)
    labels = meta["label"]
    data.class_names = [labels[str(c)] for c in range(len(labels))]
    if data.num_classes < max(int(s.targets.max()) for s in data.sites["all"].values()) + 1:
        raise FedkitError(f"{path}: labels exceed the {len(labels)} classes of {flag}")
    return data


def _download(flag: str, size: int, root: Path) -> None:
    import medmnist

    root.mkdir(parents=True, exist_ok=True)
    dataset = getattr(medmnist, info(flag)["python_class"])
    try:
        dataset(split="train", root=str(root), download=True, size=size)
    except Exception as err:  # offline, or the mirror refused
        raise FedkitError(
            f"could not download {file_name(flag, size)} into {root}: {err}. Download it by "
            "hand (see https://medmnist.com) and set task.path to its folder"
        ) from None


def write_fake(
    root: Path, flag: str = "breastmnist", n: int = 12, size: int = 28, seed: int = 0
) -> Path:
    """``<flag>.npz`` (``<flag>_<size>.npz`` above 28 px) in MedMNIST's format: labels (N, 1),
    grey images, 2 classes; ``n`` training images, half as many for val and test."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in (("train", n), ("val", n // 2), ("test", n // 2)):
        labels = np.arange(count) % 2
        arrays[f"{split}_images"] = np.stack(
            [fakes.class_image(rng, int(y), (size, size)) for y in labels]
        )
        arrays[f"{split}_labels"] = labels[:, None].astype(np.uint8)
    path = Path(root) / file_name(flag, size)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return Path(root)
