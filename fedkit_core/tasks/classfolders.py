"""Classification data sets stored as one folder of images per class.

Two arrangements are read: split folders ``<root>/{train,val,test}/<class>/*.jpg``
(OCT-C8, the chest X-ray pneumonia set) and a single tree of class folders, possibly
nested (Kvasir v2's ``<class>/*.jpg``, HyperKvasir's ``labeled-images/<tract>/<category>/
<class>/*.jpg``). Labels follow the sorted class-folder names (torchvision's ImageFolder
order, which the papers' code uses); class names are readable versions of the folder
names, in label order, for methods that prompt a language model with them (FedCB).
A tree without split folders gets a stratified test fold (``task.fold`` of 5, fixed
seed); val is carved from train by the partitioner.

Each such data set's module (hyperkvasir, oct_c8, kvasir_v2, pneumonia) states its
:class:`FolderSet` and spec and calls :func:`load`; this module is what they share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
FOLDS = 5
FOLD_SEED = 2023
SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}

FOLD = Option(
    "fold",
    int,
    0,
    "test fold of a stratified 5-fold split when there are no split folders",
    choices=(0, 1, 2, 3, 4),
)
#: the ``task.*`` options of every class-folder task
OPTIONS = (CACHE_OPTION, AUGMENT_OPTION, TRANSFORMS_OPTION, FOLD)
#: globs that show class folders of images are there (the tasks' ``markers``)
MARKERS = ("*/*/*.jp*g", "*/*/*.png", "*/*/*/*.jp*g", "*/*/*/*.png")


@dataclass(frozen=True)
class FolderSet:
    """What a class-folder data set looks like and how it is prepared."""

    channels: int
    size: int
    #: the class folders a complete copy holds (others are accepted with a warning)
    classes: tuple[str, ...]
    #: readable class names by folder name (default: the folder name, '-' and '_' as spaces)
    names: Mapping[str, str] = field(default_factory=dict)
    fit: str = "stretch"

    def name(self, folder: str) -> str:
        return self.names.get(folder, folder.replace("-", " ").replace("_", " "))


def load(config: Config, spec: TaskSpec, layout: FolderSet) -> TaskData:
    """The TaskData of the class-folder task ``spec`` (one site; partitioners make the
    clients)."""
    opts = config.section("task")
    root = Path(config["task.path"])
    base = files.find_dir(
        root,
        lambda d: bool(split_dirs(d)) or _class_tree(d, layout),
        hint="; to make each of them a client (one folder per site), use --task folder",
    )
    if base is None:
        raise spec.layout_error(
            root,
            f"found no folders of images named after the classes ({_few(layout)})",
        )
    splits = split_dirs(base)
    if splits:
        trees = {split: files.class_folders(folder) for split, folder in splits.items()}
    else:
        trees = {"all": files.class_folders(base)}
    classes = sorted({c for tree in trees.values() for c in tree})
    _check_classes(spec, layout, classes, base)
    size = opts["image_size"] or layout.size
    inputs = [p for tree in trees.values() for paths in tree.values() for p in paths]
    params = {"size": size, "fit": layout.fit}
    items = {split: _items(tree, classes) for split, tree in trees.items()}
    if "all" in items:
        items = _fold(items.pop("all"), opts["fold"])
        params["fold"] = opts["fold"]
    elif "train" not in items:
        raise spec.layout_error(base, "split folders without a train folder")

    def build() -> TaskData:
        decoded = {s: _decode(entries, layout, size) for s, entries in items.items()}
        return TaskData(
            kind=CLASSIFICATION,
            class_names=[layout.name(c) for c in classes],
            sites={"all": decoded},
            has_sites=False,
        )

    data = cached(spec.name, VERSION, base, inputs, params, build, opts["cache"])
    return attach(data, opts["augment"], opts["transforms"])


def split_dirs(
    folder: Path, samples: Callable[[Path], list[Path]] = files.list_images
) -> dict[str, Path]:
    """``{train,val,test}`` subfolders that hold class folders of ``samples`` (images by
    default), by canonical split name."""
    out = {}
    for sub in files.subdirs(folder):
        split = SPLIT_NAMES.get(sub.name.lower())
        if split and any(samples(c) for c in files.subdirs(sub)):
            out[split] = sub
    return out


def _class_tree(folder: Path, layout: FolderSet) -> bool:
    """Does ``folder`` hold (possibly nested) folders named like the task's classes?"""
    try:
        names = files.class_folders(folder, depth=3)
    except FedkitError:  # the same class name in several folders: split folders further down
        return False
    return any(name in set(layout.classes) for name in names)


def _few(layout: FolderSet) -> str:
    shown = ", ".join(layout.classes[:4])
    return shown + (", ..." if len(layout.classes) > 4 else "")


def _check_classes(spec: TaskSpec, layout: FolderSet, classes: list[str], base: Path) -> None:
    missing = sorted(set(layout.classes) - set(classes))
    extra = sorted(set(classes) - set(layout.classes))
    if len(classes) < 2:
        raise spec.layout_error(base, f"found only the class folders {classes}")
    if missing or extra:
        files.warn(
            f"{spec.name} at {base}: class folders differ from the published set "
            f"(missing {missing}, unexpected {extra}); labels follow the folders found"
        )


def _items(tree: dict[str, list[Path]], classes: list[str]) -> list[tuple[Path, int]]:
    return [(path, classes.index(c)) for c, paths in tree.items() for path in paths]


def _decode(items: list[tuple[Path, int]], layout: FolderSet, size: int) -> Split:
    images = files.read_images([path for path, _ in items], layout.channels, size, layout.fit)
    labels = np.array([label for _, label in items], dtype=np.int64)
    return Split(torch.from_numpy(images), torch.from_numpy(labels))


def _fold(items: list[tuple[Path, int]], fold: int) -> dict[str, list[tuple[Path, int]]]:
    """Train and test of a stratified ``FOLDS``-fold split (fixed seed): test is ``fold``."""
    rng = np.random.default_rng(FOLD_SEED)
    labels = np.array([label for _, label in items])
    test = np.zeros(len(items), dtype=bool)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        test[np.array_split(members, FOLDS)[fold]] = True
    return {
        "train": [item for item, t in zip(items, test) if not t],
        "test": [item for item, t in zip(items, test) if t],
    }


def write_fake_folders(
    root: Path,
    classes: Mapping[str, str] | Sequence[str],
    per_class: int = 3,
    splits: Sequence[str] | None = None,
    channels: int = 3,
    suffix: str = ".jpg",
    size: tuple[int, int] = (30, 34),
    seed: int = 0,
) -> Path:
    """Fake ``root[/<split>]/<parents>/<class>/*<suffix>`` images (labels in the grey level,
    see :mod:`~fedkit_core.tasks.fakes`); ``classes`` may map each class to parent folders
    (HyperKvasir). Labels are the sorted class names' positions. Returns ``root``."""
    rng = np.random.default_rng(seed)
    parents = classes if isinstance(classes, Mapping) else dict.fromkeys(classes, "")
    order = sorted(parents)
    shape = size if channels == 1 else (*size, 3)
    for split in splits or [""]:
        for name, parent in parents.items():
            for k in range(per_class):
                path = Path(root) / split / parent / name / f"{name}-{split}{k}{suffix}"
                image = fakes.class_image(rng, order.index(name), shape)
                fakes.save_image(image, path, quality=95)
    return Path(root)
