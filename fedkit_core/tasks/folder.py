"""``folder``: your own classification images, one folder per site and class, without code.

Layout: ``<root>/<site>/[<split>/]<class>/<image>``. Each site is a client
(``partition.kind=sites`` is the default when there are two or more); a root whose own
subfolders are the classes (or split folders) is a single site, and partitioners make the
clients. Split folders (``train``, ``val``/``valid``/``validation``, ``test``) are optional,
per site: a site without them has only train, and test and val are carved from it
(``task.test_fraction``, ``task.val_fraction``). Labels follow the sorted union of the class
folder names over all sites (a class may be absent at a site). Any image PIL reads (png,
jpg, bmp, tif; 8 or 16 bit), grey or colour: ``task.channels`` 1 or 3, or unset for RGB
when any image has colour; resized to ``task.image_size``. Files that are not images and
folders outside the layout are skipped with a warning naming them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.tasks import classfolders, files
from fedkit_core.tasks.augment import AUGMENT_OPTION, TRANSFORMS_OPTION, attach
from fedkit_core.tasks.cache import CACHE_OPTION, cached
from fedkit_core.tasks.spec import TaskSpec

VERSION = 1
SIZE = 128
ALL = "all"
GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")

CHANNELS = Option(
    "channels",
    int,
    None,
    "1 grey or 3 RGB; unset: RGB when any image has colour, else grey",
    choices=(1, 3),
)

SPEC = TaskSpec(
    name="folder",
    description="your classification images as <site>/[<split>/]<class>/*.png|jpg, sites = clients",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    options=(CACHE_OPTION, AUGMENT_OPTION, TRANSFORMS_OPTION, CHANNELS),
    defaults={"task.image_size": SIZE},
    needs_path=True,
    layout=(
        "<task.path>/<site>/[train|val|test/]<class>/<image> (png, jpg, bmp, tif), or "
        "<task.path>/[train|val|test/]<class>/<image> for a single site"
    ),
)

#: one site's samples: split -> class folder name -> sample paths
SiteTree = dict[str, dict[str, list[Path]]]


@dataclass(frozen=True)
class Samples:
    """What one sample of a class folder is: ``list`` gives those directly in a folder
    (sorted), ``noun`` names them in messages. Lets other formats share the layout."""

    noun: str
    list: Callable[[Path], list[Path]]


IMAGES = Samples("images", files.list_images)


def load(config: Config) -> TaskData:
    """The sites, splits and classes found under ``task.path`` (see the module docstring)."""
    opts = config.section("task")
    root = Path(config["task.path"])
    classes, items = discover(SPEC, root, IMAGES)
    inputs = [p for splits in items.values() for entries in splits.values() for p, _ in entries]
    size = opts["image_size"] or SIZE

    def build() -> TaskData:
        channels = opts["channels"] or _channels(inputs)
        sites = {
            site: {split: _decode(entries, channels, size) for split, entries in splits.items()}
            for site, splits in items.items()
        }
        return TaskData(CLASSIFICATION, classes, sites, has_sites=len(sites) > 1)

    params = {"size": size, "channels": opts["channels"]}
    data = cached(SPEC.name, VERSION, root, inputs, params, build, opts["cache"])
    return attach(data, opts["augment"], opts["transforms"])


def discover(
    spec: TaskSpec, root: Path, kind: Samples
) -> tuple[list[str], dict[str, dict[str, list[tuple[Path, int]]]]]:
    """The class names (sorted union over the sites) and, per site and split, its samples
    with their labels, found under ``root`` in the layout of the module docstring; the
    layout errors name ``spec``'s layout."""
    trees = {
        site: _site_tree(spec, folder, kind) for site, folder in _sites(spec, root, kind).items()
    }
    classes = sorted({c for tree in trees.values() for split in tree.values() for c in split})
    if len(classes) < 2:
        raise spec.layout_error(root, f"found only the class folders {classes}; need two or more")
    items = {
        site: {
            split: [(p, classes.index(c)) for c, ps in t.items() for p in ps]
            for split, t in tree.items()
        }
        for site, tree in trees.items()
    }
    return classes, items


def _holds_classes(folder: Path, kind: Samples) -> bool:
    """Is ``folder`` one site's folder: split folders, or class folders holding samples?"""
    return bool(classfolders.split_dirs(folder, kind.list)) or any(
        kind.list(sub) for sub in files.subdirs(folder)
    )


def _sites(spec: TaskSpec, root: Path, kind: Samples) -> dict[str, Path]:
    """Site name -> folder; the root itself is the one site ``all`` when it holds split
    folders, or class folders and no site folders (a stray sample in a site folder does not
    turn the sites into classes)."""
    if not root.is_dir():
        raise spec.layout_error(root, "task.path is not a folder")
    if classfolders.split_dirs(root, kind.list):
        return {ALL: root}
    sites, others = {}, []
    for sub in files.subdirs(root):
        if _holds_classes(sub, kind):
            sites[sub.name] = sub
        else:
            others.append(sub)
    if not sites and any(kind.list(sub) for sub in others):
        return {ALL: root}
    if not sites:
        raise spec.layout_error(
            root, f"found no folders of {kind.noun} (<site>/<class>/<{kind.noun[:-1]}>)"
        )
    if others:
        files.warn(f"{root}: skipped {_names(others)}: no class folders of {kind.noun} inside")
    return sites


def _site_tree(spec: TaskSpec, folder: Path, kind: Samples) -> SiteTree:
    """One site's class folders by split; ``train`` only when the site has no split folders."""
    splits = classfolders.split_dirs(folder, kind.list)
    if not splits:
        return {"train": _class_samples(folder, kind)}
    if "train" not in splits:
        raise spec.layout_error(folder, f"split folders {sorted(splits)} without a train folder")
    skipped = [sub for sub in files.subdirs(folder) if sub not in splits.values()]
    if skipped:
        files.warn(f"{folder}: skipped {_names(skipped)} beside the split folders")
    return {split: _class_samples(sub, kind) for split, sub in splits.items()}


def _class_samples(folder: Path, kind: Samples) -> dict[str, list[Path]]:
    """Class folder name -> its samples; anything else in or beside them is reported."""
    out, empty, strays = {}, [], [p for p in folder.iterdir() if p.is_file()]
    for sub in files.subdirs(folder):
        samples = kind.list(sub)
        if samples:
            out[sub.name] = samples
        else:
            empty.append(sub)
        listed = set(samples)
        strays += [p for p in sub.iterdir() if p not in listed and not _hidden(p)]
    strays = [p for p in strays if not _hidden(p)]
    if empty:
        files.warn(f"{folder}: skipped {_names(empty)}: no {kind.noun} directly inside")
    if strays:
        files.warn(
            f"{folder}: skipped {len(strays)} file(s) that are not {kind.noun} in class "
            f"folders: {_names(strays)}"
        )
    return out


def _hidden(path: Path) -> bool:
    return path.name.startswith((".", "__"))  # .DS_Store, .fedkit-cache, __MACOSX


def _names(paths: Sequence[Path], limit: int = 5) -> str:
    shown = ", ".join(p.name for p in paths[:limit])
    return f"[{shown}{', ...' if len(paths) > limit else ''}]"


def _channels(paths: Sequence[Path]) -> int:
    """3 when any image is stored in colour, else 1 (image headers only, nothing decoded)."""
    return 1 if set(files.parallel_map(files.image_mode, paths)) <= set(GREY_MODES) else 3


def _decode(entries: list[tuple[Path, int]], channels: int, size: int) -> Split:
    images = files.read_images([p for p, _ in entries], channels, size)
    labels = np.array([label for _, label in entries], dtype=np.int64)
    return Split(torch.from_numpy(images), torch.from_numpy(labels))


def write_fake(
    root: Path,
    sites: Sequence[str] = ("hospital-a", "hospital-b", "hospital-c"),
    classes: Sequence[str] = ("normal", "pneumonia"),
    per_class: int = 3,
    splits: Sequence[str] | None = None,
    channels: int = 1,
    suffix: str = ".png",
) -> Path:
    """``root/<site>/[<split>/]<class>/*<suffix>`` (labels in the grey level, see
    :mod:`~fedkit_core.tasks.fakes`). Returns ``root``."""
    for seed, site in enumerate(sites):
        classfolders.write_fake_folders(
            Path(root) / site, classes, per_class, splits, channels, suffix, seed=seed
        )
    return Path(root)
