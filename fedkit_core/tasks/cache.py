"""A cache of decoded, resized task data, so that only the first run pays for decoding.

The cache holds a task's sites and splits as tensors plus its description (classes,
sites, shot groups) and its normaliser's statistics (pooling a large training set to
compute them costs more than reading the cache). Its key covers the task, its loader
version, the data folder, the preprocessing parameters and every source file's path and
a digest of its bytes (:mod:`.digests`; computed once, rechecked by one ``stat`` per file):
any change to the data or the options makes a new entry, even one that keeps a file's size
and modification time (``cp -p``, ``rsync -t``). Entries live in
the user cache (``$FEDKIT_CACHE``, by default ``$XDG_CACHE_HOME/fedkit`` or
``~/.cache/fedkit``), so that a data folder is never written to; ``task.cache=data`` puts
them in ``<data folder>/.fedkit-cache/`` instead when that folder is writable (by its
permission bits, so that a read-only data folder stays untouched even for root).
Writes are atomic: a run killed while writing leaves no partial entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedkit_core.contract.data import Normalizer, Split, TaskData
from fedkit_core.contract.options import Option
from fedkit_core.fileio import FILE_MODE, write_torch
from fedkit_core.tasks.digests import file_digests
from fedkit_core.tasks.files import warn
from fedkit_core.tasks.normalize import fit_normalizer

CACHE_ENV = "FEDKIT_CACHE"
DATA_CACHE_DIR = ".fedkit-cache"
FORMAT = 3

USER, DATA, OFF = "user", "data", "off"
#: the ``task.cache`` option every file-based task declares
CACHE_OPTION = Option(
    "cache",
    str,
    USER,
    "cache the decoded, resized arrays for faster reruns: in the user cache folder, in "
    ".fedkit-cache beside the data, or off",
    choices=(USER, DATA, OFF),
)


def user_cache_dir() -> Path:
    """``$FEDKIT_CACHE``, else ``$XDG_CACHE_HOME/fedkit``, else ``~/.cache/fedkit``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "fedkit"


def cache_key(
    task: str,
    version: int,
    root: Path,
    files: Iterable[Path],
    params: Mapping[str, Any],
    memo: Path | None = None,
    mode: int | None = None,
) -> str:
    """A digest of everything the cached arrays depend on: the task, its options and the
    bytes of every source file (their digests kept in ``memo``, see :mod:`.digests`)."""
    digest = hashlib.sha256()
    head = {"task": task, "version": version, "format": FORMAT, "root": str(root.resolve())}
    digest.update(json.dumps({**head, "params": params}, sort_keys=True, default=str).encode())
    contents = file_digests(sorted(Path(f) for f in files), memo, mode)
    for path, content in contents.items():
        digest.update(f"\n{path}\t{content}".encode())
    return digest.hexdigest()[:24]


def digest_memo(root: Path, where: str = USER) -> Path:
    """Where the digests of the files under ``root`` are kept: beside the cache entries."""
    tag = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return cache_dirs(root, where)[0] / f"files-{tag}.json"


def cache_dirs(root: Path, where: str = USER) -> list[Path]:
    """Where entries for data under ``root`` may live, in order of preference: beside the
    data only when ``where`` is ``data`` (and the folder is writable), then the user cache."""
    folder = root if root.is_dir() else root.parent
    local = [folder / DATA_CACHE_DIR] if where == DATA and _writable(folder) else []
    return [*local, user_cache_dir() / "tasks"]


def _writable(folder: Path) -> bool:
    """Writable by its owner's permission bits and by this process (root ignores the bits)."""
    try:
        return bool(folder.stat().st_mode & stat.S_IWUSR) and os.access(folder, os.W_OK)
    except OSError:
        return False


def cached(
    task: str,
    version: int,
    root: Path,
    files: Iterable[Path],
    params: Mapping[str, Any],
    build: Callable[[], TaskData],
    where: str = USER,
) -> TaskData:
    """``build()``'s TaskData, read from the cache when an entry for the same inputs exists.

    The data (sites, splits, classes, shot groups) and the normaliser fitted to it are
    cached; a loader attaches its augmentation (or another normaliser) afterwards.
    ``version`` is the loader's preprocessing version: bump it when the decoding changes
    so that old entries are not reused. ``where`` is ``task.cache``: ``user``, ``data`` or
    ``off``.
    """
    if where == OFF:
        return build()
    key = cache_key(task, version, root, files, params, digest_memo(root, where), _mode_of(root))
    name = f"{task}-{key}.pt"
    for folder in cache_dirs(root, where):
        entry = folder / name
        if entry.is_file():
            data = _read(entry)
            if data is not None:
                return data
    data = build()
    if data.normalizer is None:
        data.normalizer = fit_normalizer(data)
    _write(name, cache_dirs(root, where), data, _mode_of(root))
    return data


def _mode_of(root: Path) -> int:
    """Permission bits of a cache entry of the data in ``root``: what a file gets (the umask
    applied), less what the data denies: a data folder only its owner may read gives an
    entry only its owner may read, so the cache never shares what the data keeps private."""
    try:
        source = stat.S_IMODE(root.stat().st_mode)
    except OSError:
        source = 0o600
    return FILE_MODE & source & 0o666


def _read(entry: Path) -> TaskData | None:
    try:
        saved = torch.load(entry, map_location="cpu", weights_only=True, mmap=True)
        meta = json.loads(saved["meta"])
        sites = {
            site: {split: Split(arrays["images"], arrays["targets"]) for split, arrays in s.items()}
            for site, s in saved["sites"].items()
        }
    except Exception as err:  # a damaged entry is rebuilt, never fatal
        warn(f"ignoring unreadable cache entry {entry}: {err}")
        return None
    return TaskData(
        kind=meta["kind"],
        class_names=meta["class_names"],
        sites=sites,
        has_sites=meta["has_sites"],
        shot_groups=meta["shot_groups"],
        normalizer=Normalizer(tuple(meta["mean"]), tuple(meta["std"])),
    )


def _write(name: str, folders: list[Path], data: TaskData, mode: int) -> None:
    meta = {
        "kind": data.kind,
        "class_names": list(data.class_names),
        "has_sites": data.has_sites,
        "shot_groups": data.shot_groups,
        "mean": list(data.normalizer.mean),
        "std": list(data.normalizer.std),
    }
    payload = {
        "meta": json.dumps(meta),
        "sites": {
            site: {
                split: {"images": s.images.contiguous(), "targets": s.targets}
                for split, s in splits.items()
            }
            for site, splits in data.sites.items()
        },
    }
    errors = []
    for folder in folders:
        try:
            write_torch(folder / name, payload, mode)
            return
        except (OSError, RuntimeError) as err:  # read-only folder, full disk (torch raises
            # RuntimeError there): fall back to the user cache, else run without caching
            errors.append(f"{folder}: {getattr(err, 'strerror', None) or err}")
    warn(f"could not write the task cache ({'; '.join(errors)}); the next run decodes again")
