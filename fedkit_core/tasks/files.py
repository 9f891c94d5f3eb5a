"""Reading on-disk data sets: images, masks, paired image/mask folders, class-folder trees.

Shared by every file-based task, so that a loader only states its layout (errors about the
layout come from the task's spec: ``SPEC.layout_error(root, problem)``). Images come back
channels-first uint8 arrays already resized (JPEGs are decoded at reduced scale when that
suffices, which makes first loads of large photographs several times faster).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
#: name endings that mark a mask file of the image with the same name without them
MASK_ENDINGS = ("_segmentation", "_mask", "-mask", "_seg", "_label", "_gt")

#: the ``task.pairing`` option of the tasks whose images and masks are paired by :func:`pair_files`
PAIRING = Option(
    "pairing",
    str,
    "auto",
    "pair images and masks by file name; auto also pairs equally many leftovers in name order",
    choices=("auto", "name"),
)

T = TypeVar("T")
R = TypeVar("R")


class DataWarning(UserWarning):
    """Something in a data set was skipped or guessed; the message says what and where."""


def warn(message: str) -> None:
    warnings.warn(message, DataWarning, stacklevel=3)


def is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def list_images(folder: Path) -> list[Path]:
    """The image files directly in ``folder``, sorted by name (hidden files ignored)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and is_image(p))


def subdirs(folder: Path) -> list[Path]:
    """Visible subfolders of ``folder``, sorted by name (``__MACOSX`` and dot folders ignored)."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith((".", "__"))  # .fedkit-cache, __MACOSX
    )


def find_dir(
    root: Path, accept: Callable[[Path], bool], depth: int = 3, hint: str = ""
) -> Path | None:
    """The shallowest folder at or below ``root`` (up to ``depth`` levels) that ``accept``s.

    Lets ``task.path`` point at the data set's folder or at any folder a few levels above
    it (an unpacked archive often nests ``chest_xray/chest_xray/...``). When several
    folders at that depth accept (one copy per hospital), the first is used and the others
    are reported, followed by ``hint``.
    """
    level = [root]
    for _ in range(depth + 1):
        found = [folder for folder in level if accept(folder)]
        if found:
            if len(found) > 1:
                others = [str(f.relative_to(root)) for f in found[1:]]
                warn(
                    f"{root}: {len(found)} folders hold the data set's layout; read only "
                    f"{found[0].relative_to(root)} and ignored {others} (point task.path at "
                    f"the one you mean{hint})"
                )
            return found[0]
        level = [sub for folder in level for sub in subdirs(folder)]
    return None


def parallel_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]`` on a thread pool (PIL and nibabel decode outside the GIL)."""
    workers = min(8, os.cpu_count() or 1, max(1, len(items)))
    if workers == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


#: environment variable raising the most pixels an image may have (PIL's guard against
#: decompression bombs: a small file that decodes to gigabytes)
MAX_PIXELS_ENV = "FEDKIT_MAX_IMAGE_PIXELS"


@contextmanager
def open_image(path: Path) -> Iterator[Any]:
    """``PIL.Image.open(path)``, with a clear error for an image over the pixel limit
    (PIL's, or :data:`MAX_PIXELS_ENV` when set) and for one PIL cannot read."""
    from PIL import Image

    limit = _pixel_limit()
    Image.MAX_IMAGE_PIXELS = limit // 2  # PIL refuses above twice this, warns above it
    try:
        with Image.open(path) as im:
            yield im
    except Image.DecompressionBombError as err:
        raise FedkitError(
            f"cannot read {path}: {err} (more than {limit:,} pixels, the limit that guards "
            f"against decompression bombs); if the image is genuine, raise the limit with "
            f"the environment variable {MAX_PIXELS_ENV}=<pixels>"
        ) from None
    except (OSError, ValueError) as err:  # not an image, truncated, unsupported mode
        raise FedkitError(f"cannot read {path} as an image: {err}") from None


def _pixel_limit() -> int:
    """The most pixels an image may have: :data:`MAX_PIXELS_ENV`, else PIL's default
    (twice its ``MAX_IMAGE_PIXELS`` of 89,478,485: it only warns below that)."""
    text = os.environ.get(MAX_PIXELS_ENV, "").replace("_", "").replace(",", "")
    if not text:
        return 2 * 89_478_485
    if not text.isdigit() or int(text) < 1:
        raise FedkitError(f"{MAX_PIXELS_ENV} must be a whole number of pixels, got {text!r}")
    return int(text)


def read_image(path: Path, channels: int, size: int | None, fit: str = "stretch") -> np.ndarray:
    """An image as a (C, H, W) uint8 array with ``channels`` (1 grey, 3 RGB).

    ``size`` resizes to ``size`` x ``size``: ``fit="stretch"`` resizes the whole image,
    ``fit="crop"`` scales the shorter side to ``size`` and keeps the centre square.
    """
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    with open_image(path) as im:
        if size:
            im.draft(mode, (size, size))  # JPEG: decode at the smallest scale >= size
        im = _to_8bit(im, path).convert(mode)
        if size:
            im = _fit(im, size, fit, Image.Resampling.BILINEAR)
        array = np.asarray(im, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def image_mode(path: Path) -> str:
    """The PIL mode of an image file (``L``, ``RGB``, ``I;16``, ...), from its header only."""
    with open_image(path) as im:
        return im.mode


def read_mask(path: Path, size: int | None) -> np.ndarray:
    """A label image as an (H, W) uint8 array of its grey values, resized by nearest neighbour."""
    from PIL import Image

    with open_image(path) as im:
        im = _to_8bit(im, path)
        if im.mode != "L":  # a palette mask too: its colours' grey values, not its indices
            im = im.convert("L")
        if size:
            im = _fit(im, size, "stretch", Image.Resampling.NEAREST)
        return np.asarray(im, dtype=np.uint8)


def _to_8bit(im, path: Path):
    """16-bit and float images scaled to 8 bits (PIL's convert("L") would clip them); a
    float image holding NaN or inf is refused, as a data set of such arrays is."""
    from PIL import Image

    if im.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        array = np.asarray(im, dtype=np.float64)
        if not np.isfinite(array).all():
            raise FedkitError(
                f"{path} holds pixel values that are not finite (NaN or inf); fedkit scales a "
                "float image's range to 8 bits, which needs finite values: fix or remove it"
            )
        low, high = float(array.min()), float(array.max())
        scaled = (array - low) / (high - low) * 255.0 if high > low else np.zeros_like(array)
        return Image.fromarray(scaled.round().astype(np.uint8))
    return im


def _fit(im, size: int, fit: str, resample):
    if fit == "crop":
        scale = size / min(im.size)
        width, height = max(size, round(im.width * scale)), max(size, round(im.height * scale))
        im = im.resize((width, height), resample)
        left, top = (width - size) // 2, (height - size) // 2
        return im.crop((left, top, left + size, top + size))
    return im.resize((size, size), resample)


def mask_key(path: Path) -> str:
    """The name an image and its mask share: the stem without a mask ending, lower case."""
    stem = path.name.split(".")[0].lower()
    for ending in MASK_ENDINGS:
        if stem.endswith(ending):
            return stem[: -len(ending)]
    return stem


def pair_files(
    images: Iterable[Path], masks: Iterable[Path], where: str, pairing: str = "auto"
) -> list[tuple[Path, Path]]:
    """Pair each image with the mask of the same name (see :func:`mask_key`).

    Files left without a partner are reported. With ``pairing="auto"``, when as many
    images as masks are left over they are paired in sorted name order (the real
    ProstateSlice sample ships ``I2CVB/train/image/00_01.png`` with ``mask/00_00.png``);
    with ``pairing="name"`` they are skipped.
    """
    by_key = {mask_key(m): m for m in sorted(masks)}
    pairs, lone_images = [], []
    for image in sorted(images):
        mask = by_key.pop(mask_key(image), None)
        if mask is None:
            lone_images.append(image)
        else:
            pairs.append((image, mask))
    lone_masks = sorted(by_key.values())
    if not lone_images and not lone_masks:
        return pairs
    if pairing == "auto" and len(lone_images) == len(lone_masks):
        shown = ", ".join(
            f"{i.name} <-> {m.name}" for i, m in list(zip(lone_images, lone_masks))[:5]
        )
        warn(
            f"{where}: {len(lone_images)} image(s) and mask(s) have different names and were "
            f"paired in sorted order: {shown}. Set task.pairing=name to skip them instead."
        )
        return sorted(pairs + list(zip(lone_images, lone_masks)))
    warn(
        f"{where}: skipped {len(lone_images)} image(s) without a mask of the same name "
        f"{_names(lone_images)} and {len(lone_masks)} mask(s) without an image {_names(lone_masks)}"
    )
    return pairs


def _names(paths: Sequence[Path], limit: int = 5) -> str:
    shown = ", ".join(p.name for p in paths[:limit])
    more = f", ... ({len(paths) - limit} more)" if len(paths) > limit else ""
    return f"[{shown}{more}]" if paths else "[]"


def class_folders(root: Path, depth: int = 4) -> dict[str, list[Path]]:
    """The leaf folders under ``root`` that hold images, by folder name (sorted by name).

    Serves flat ``root/<class>/*.jpg`` trees and nested ones such as HyperKvasir's
    ``labeled-images/<tract>/<category>/<class>/*.jpg``. Two leaves with the same name
    are an error (their classes could not be told apart).
    """
    found: dict[str, list[Path]] = {}
    where: dict[str, Path] = {}
    level = [root]
    for _ in range(depth + 1):
        nxt = []
        for folder in level:
            images = list_images(folder)
            if images and folder != root:
                if folder.name in found:
                    raise FedkitError(
                        f"two class folders are both named {folder.name!r}: {where[folder.name]} "
                        f"and {folder}; rename one"
                    )
                found[folder.name], where[folder.name] = images, folder
            nxt.extend(subdirs(folder))
        level = nxt
    return dict(sorted(found.items()))


def decode_pairs(
    pairs: Sequence[tuple[Path, Path]], channels: int, size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, C, H, W) and masks (N, H, W), both uint8, of image/mask file pairs."""
    if not pairs:
        side = size or 1
        return np.zeros((0, channels, side, side), np.uint8), np.zeros((0, side, side), np.uint8)

    def one(pair: tuple[Path, Path]) -> tuple[np.ndarray, np.ndarray]:
        image, mask = read_image(pair[0], channels, size), read_mask(pair[1], size)
        if image.shape[1:] != mask.shape:
            raise FedkitError(
                f"{pair[0]} is {image.shape[2]}x{image.shape[1]} but its mask {pair[1]} is "
                f"{mask.shape[1]}x{mask.shape[0]}; set task.image_size to resize both"
            )
        return image, mask

    decoded = parallel_map(one, pairs)
    shapes = {image.shape for image, _ in decoded}
    if len(shapes) > 1:
        raise FedkitError(
            f"images of different sizes {sorted(shapes)} (e.g. {pairs[0][0]}); "
            "set task.image_size to resize them to one size"
        )
    return np.stack([d[0] for d in decoded]), np.stack([d[1] for d in decoded])


def read_images(
    paths: Sequence[Path], channels: int, size: int, fit: str = "stretch"
) -> np.ndarray:
    """Many images as one (N, C, size, size) uint8 array, decoded in parallel into place."""
    out = np.empty((len(paths), channels, size, size), np.uint8)

    def fill(i: int) -> None:
        out[i] = read_image(paths[i], channels, size, fit)

    parallel_map(fill, range(len(paths)))
    return out
