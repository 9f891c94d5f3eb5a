"""``npz``: any classification data in MedMNIST's ``.npz`` format runs without code.

The file holds ``{train,val,test}_images`` as (N, H, W) or (N, H, W, C) uint8 and
``{train,val,test}_labels`` as (N,) or (N, 1); ``val`` is optional (carved from train when
absent); ``classes`` optionally names the classes in label order. A ``site`` array (N,)
(strings or numbers) aligned with the train images makes each site a client
(``partition.kind=sites`` by default), with ``test_site`` and ``val_site`` for the other
splits (a split without its site array is an error then: its images could not be shared
out; without val, each site's val is carved from its train). The readers of the file and
its arrays are shared with ``npz-seg`` and ``medmnist``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import (
    CLASSIFICATION,
    MAX_CLASSES,
    SPLITS,
    Split,
    TaskData,
    classes_up_to,
)
from fedkit_core.errors import FedkitError
from fedkit_core.tasks import fakes
from fedkit_core.tasks.spec import TaskSpec

LAYOUT = (
    "an .npz file with train_images, train_labels, test_images, test_labels "
    "(and optionally val_images, val_labels, classes), as MedMNIST ships them; "
    "optionally site (one per train image), val_site, test_site"
)
REQUIRED = ("train_images", "train_labels", "test_images", "test_labels")
#: the arrays a file may also hold (any other member is never read)
OPTIONAL = ("val_images", "val_labels", "classes", "site", "val_site", "test_site")
#: the site array of each split (``site`` is the train split's)
SITE_KEYS = {"train": "site", "val": "val_site", "test": "test_site"}

SPEC = TaskSpec(
    name="npz",
    description="your classification data in MedMNIST's .npz format (task.path=FILE.npz)",
    kind=CLASSIFICATION,
    loader=f"{__name__}:load",
    needs_path=True,
    layout=LAYOUT,
)


def load(config: Config) -> TaskData:
    path = Path(config["task.path"])
    arrays = read_npz(path, REQUIRED, LAYOUT, OPTIONAL)
    return by_site(classification_arrays(arrays, path), arrays, path)


def read_npz(
    path: str | Path, required: tuple[str, ...], layout: str, optional: tuple[str, ...] = ()
) -> dict[str, np.ndarray]:
    """The ``required`` and ``optional`` arrays of an npz file, or a FedkitError saying what
    is wrong with it. Other members are never decompressed, and a member whose size (its
    uncompressed size in the archive's header) exceeds :func:`member_limit` is refused
    before it is: a few compressed megabytes may stand for gigabytes."""
    path = Path(path)
    if path.is_dir():
        raise FedkitError(f"{path} is a folder; task.path must name the .npz file")
    try:
        npz = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FedkitError(f"{path} does not exist. Expected {layout}.") from None
    except Exception as err:  # numpy raises many kinds for a damaged or foreign file
        raise FedkitError(
            f"cannot read {path} as an .npz file ({err}). Expected {layout}."
        ) from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise FedkitError(f"{path} holds a single array (.npy), not an .npz archive: {layout}")
    with npz:
        missing = [key for key in required if key not in npz.files]
        if missing:
            raise FedkitError(
                f"{path} lacks {', '.join(missing)} (it has "
                f"{', '.join(sorted(npz.files)) or 'nothing'}). Expected {layout}."
            )
        wanted = [key for key in dict.fromkeys(required + optional) if key in npz.files]
        limit = member_limit()
        for key in wanted:
            size = npz.zip.getinfo(f"{key}.npy").file_size
            if size > limit:
                raise FedkitError(
                    f"{path}: its member {key} would take {size / 2**30:.1f} GiB once "
                    f"decompressed, more than half this machine's memory "
                    f"({limit / 2**30:.1f} GiB): it is not read"
                )
        try:
            return {key: npz[key] for key in wanted}
        except Exception as err:  # a damaged member: bad zlib stream, truncated header, ...
            raise FedkitError(f"{path} is damaged ({type(err).__name__}: {err})") from None


def member_limit() -> int:
    """The most bytes one npz member may hold decompressed: half the machine's memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # not POSIX: no limit known
        return 2**62


def channels_first(images: np.ndarray, path: Path, key: str) -> torch.Tensor:
    """(N, H, W) or (N, H, W, C) uint8 -> (N, C, H, W) uint8 tensor."""
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[3] not in (1, 2, 3, 4):
        raise FedkitError(
            f"{path}: {key} has shape {images.shape}, read as (N,H,W,C) that is "
            f"{images.shape[3]} channels: a 3-D volume (N,D,H,W)? fedkit reads 2-D images; "
            "store the volumes' slices as images (N*D,H,W)"
        )
    elif images.ndim == 4:
        images = images.transpose(0, 3, 1, 2)
    else:
        raise FedkitError(f"{path}: {key} must be (N,H,W) or (N,H,W,C), got shape {images.shape}")
    if images.dtype != np.uint8:
        raise FedkitError(f"{path}: {key} must be uint8, got {images.dtype}")
    return torch.from_numpy(np.ascontiguousarray(images))


def integer_labels(values: np.ndarray, path: Path, key: str) -> torch.Tensor:
    """Labels or masks as int64; fractional or non-numeric values are an error, not rounded."""
    if values.dtype.kind in "iub":
        return torch.from_numpy(values.astype(np.int64))
    if (
        values.dtype.kind == "f"
        and np.all(np.isfinite(values))
        and np.all(values == np.round(values))
    ):
        return torch.from_numpy(values.astype(np.int64))
    raise FedkitError(
        f"{path}: {key} must hold integer class labels, got {values.dtype} values "
        f"such as {values.reshape(-1)[:3].tolist()}"
    )


def class_names(arrays: dict[str, np.ndarray], num_classes: int, fallback: list[str]) -> list[str]:
    if "classes" in arrays:
        names = [str(c) for c in arrays["classes"][:MAX_CLASSES].tolist()]
        if len(names) >= num_classes:
            return names
    return fallback


def classification_file(path: Path) -> TaskData:
    """The TaskData of one classification .npz file (MedMNIST's files), as one site."""
    return classification_arrays(read_npz(path, REQUIRED, LAYOUT, OPTIONAL[:3]), path)


def classification_arrays(arrays: dict[str, np.ndarray], path: Path) -> TaskData:
    """The TaskData of a classification .npz file's arrays, as one site."""
    splits: dict[str, Split] = {}
    for split in SPLITS:
        pair = [f"{split}_images" in arrays, f"{split}_labels" in arrays]
        if not any(pair):
            continue
        if not all(pair):
            have, lack = (f"{split}_images", f"{split}_labels")[:: 1 if pair[0] else -1]
            raise FedkitError(f"{path} has {have} but no {lack}")
        labels = integer_labels(arrays[f"{split}_labels"], path, f"{split}_labels")
        if labels.ndim == 2 and labels.shape[1] > 1:
            raise FedkitError(
                f"{path}: {split}_labels has shape {labels.shape}: multi-label data is not supported"
            )
        images = channels_first(arrays[f"{split}_images"], path, f"{split}_images")
        labels = labels.reshape(-1)
        if len(labels) != len(images):
            raise FedkitError(f"{path}: {len(images)} {split}_images but {len(labels)} labels")
        if len(images):  # an empty split is as good as none (val is then carved)
            splits[split] = Split(images, labels)
    if "train" not in splits or "test" not in splits:
        raise FedkitError(f"{path}: train and test need at least one image each")
    shapes = {tuple(s.images.shape[1:]) for s in splits.values()}
    if len(shapes) > 1:
        raise FedkitError(f"{path}: the splits' images differ in shape (C,H,W): {sorted(shapes)}")
    num_classes = classes_up_to(max(int(s.targets.max()) for s in splits.values()), str(path))
    names = class_names(arrays, num_classes, [f"class{c}" for c in range(num_classes)])
    return TaskData(kind=CLASSIFICATION, class_names=names, sites={"all": splits}, has_sites=False)


def by_site(data: TaskData, arrays: dict[str, np.ndarray], path: Path) -> TaskData:
    """``data`` split into the sites of the file's ``site`` arrays (unchanged without them)."""
    if "site" not in arrays:
        return data
    splits = data.sites["all"]
    sites: dict[str, dict[str, Split]] = {}
    for split, values in _site_values(splits, arrays, path).items():
        for name in dict.fromkeys(values.tolist()):
            index = np.flatnonzero(values == name)
            sites.setdefault(name, {})[split] = splits[split].subset(index)
    lonely = [name for name, own in sites.items() if "train" not in own]
    if lonely:
        raise FedkitError(f"{path}: the sites {lonely} have val or test images but no train images")
    return TaskData(CLASSIFICATION, data.class_names, sites, has_sites=True)


def _site_values(
    splits: dict[str, Split], arrays: dict[str, np.ndarray], path: Path
) -> dict[str, np.ndarray]:
    """Each split's site names as strings, checked against the split's size."""
    out = {}
    for split, key in SITE_KEYS.items():
        if split not in splits:
            continue
        if key not in arrays:
            raise FedkitError(
                f"{path} has a site array but no {key} for its {split} images: add {key} "
                f"(one site name per {split} image)"
            )
        values = np.asarray(arrays[key]).astype(str)
        if values.shape != (len(splits[split]),):
            raise FedkitError(
                f"{path}: {key} must hold one site per {split} image "
                f"({len(splits[split])}), got shape {values.shape}"
            )
        out[split] = values
    return out


def write_fake(
    root: Path, train: int = 40, test: int = 12, channels: int = 1, size: int = 8, seed: int = 0
) -> Path:
    """``root/fake.npz`` with train and test splits of 3 classes, labels (N, 1) as MedMNIST
    stores them, ``channels`` 1 (N, H, W) or 3 (N, H, W, 3). Returns the file."""
    rng = np.random.default_rng(seed)
    shape = (size, size) if channels == 1 else (size, size, channels)
    arrays = {}
    for split, n in (("train", train), ("test", test)):
        labels = np.arange(n) % 3
        arrays[f"{split}_images"] = np.stack(
            [fakes.class_image(rng, int(y), shape) for y in labels]
        )
        arrays[f"{split}_labels"] = labels[:, None]
    path = Path(root) / "fake.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path
