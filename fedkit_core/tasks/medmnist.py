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

from fedkit_core.config import Config
from fedkit_core.errors import FedkitError, unknown
from fedkit_core.tasks import files
from fedkit_core.tasks.base import TaskData
from fedkit_core.tasks.npz import classification_file

NAME = "medmnist"


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
            raise files.layout_error(
                NAME,
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
