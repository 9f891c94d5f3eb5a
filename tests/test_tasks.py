"""Built-in tasks: synthetic determinism, npz file tasks and their error messages."""

import numpy as np
import pytest

from fedkit_core import FedkitError, resolve_config, run
from fedkit_core.federation import prepare
from fedkit_core.tasks import npz, npz_seg
from fedkit_core.tasks.registry import all_tasks
from fedkit_core.testing import shared_data, tiny


def test_builtin_tasks_are_registered():
    assert {"synthetic", "synthetic-seg", "npz", "npz-seg"} <= set(all_tasks())


def test_synthetic_is_deterministic_per_seed_and_long_tailed():
    a = prepare(*resolve_config(tiny(seed=3)))
    b = prepare(*resolve_config(tiny(seed=3)))
    assert a.infos == b.infos
    counts = np.sum([c.class_counts for c in a.infos.values()], axis=0)
    assert counts.max() >= 2.5 * counts.min()
    assert a.task.shot_groups and set(a.task.shot_groups) == {"head", "medium", "tail"}
    assert a.task.client_ids == list(a.infos)


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_npz_classification_with_grey_and_rgb_images(tmp_path):
    for channels in (1, 3):
        path = str(npz.write_fake(tmp_path / str(channels), train=40, test=12, channels=channels))
        fed = prepare(*resolve_config({"task": {"name": "npz", "path": path}, "clients": 2}))
        assert fed.task.in_channels == channels
        assert sum(c.num_test for c in fed.infos.values()) == 12


@pytest.mark.parametrize(
    "content, message",
    [
        ("not a zip", "cannot read"),
        (None, "lacks test_images, test_labels"),
    ],
)
def test_npz_errors_say_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "bad.npz"
    if content is None:
        np.savez(path, train_images=np.zeros((4, 8, 8), np.uint8), train_labels=np.zeros(4))
    else:
        path.write_text(content)
    with pytest.raises(FedkitError, match=message):
        run({"task": {"name": "npz", "path": str(path)}})


def _classification_arrays(n=8, **changes):
    arrays = {
        "train_images": np.zeros((n, 8, 8), np.uint8),
        "train_labels": np.arange(n) % 2,
        "test_images": np.zeros((4, 8, 8), np.uint8),
        "test_labels": np.arange(4) % 2,
    }
    arrays.update(changes)
    return {k: v for k, v in arrays.items() if v is not None}


def _damaged_member(path):
    np.savez_compressed(path, **_classification_arrays())
    blob = bytearray(path.read_bytes())
    blob[200:240] = bytes(40)  # inside the first member's compressed data
    path.write_bytes(bytes(blob))


BAD_NPZ = {
    "damaged member": (_damaged_member, "damaged|cannot read"),
    "npy file": (lambda p: np.save(p.with_suffix(".npy"), np.zeros(3)), "single array"),
    "images without labels": (
        lambda p: np.savez(p, **_classification_arrays(val_images=np.zeros((2, 8, 8), np.uint8))),
        "val_images but no val_labels",
    ),
    "empty test split": (
        lambda p: np.savez(
            p,
            **_classification_arrays(
                test_images=np.zeros((0, 8, 8), np.uint8), test_labels=np.zeros(0, int)
            ),
        ),
        "train and test need at least one image",
    ),
    "string labels": (
        lambda p: np.savez(p, **_classification_arrays(train_labels=np.array(["a"] * 8))),
        "must hold integer class labels",
    ),
    "fractional labels": (
        lambda p: np.savez(p, **_classification_arrays(train_labels=np.full(8, 0.5))),
        "must hold integer class labels",
    ),
    "channels differ": (
        lambda p: np.savez(
            p, **_classification_arrays(test_images=np.zeros((4, 8, 8, 3), np.uint8))
        ),
        "differ in shape",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_NPZ))
def test_bad_npz_files_are_user_errors(tmp_path, case):
    write, message = BAD_NPZ[case]
    path = tmp_path / "bad.npz"
    write(path)
    if case == "npy file":
        path = path.with_suffix(".npy")
    with pytest.raises(FedkitError, match=message):
        run({"task": {"name": "npz", "path": str(path)}, "rounds": 1})


@pytest.mark.parametrize(
    "masks, extra, message",
    [
        (np.full((6, 8, 8), 255, np.uint8), {}, "grey levels rather than class labels"),
        (np.full((6, 8, 8), 0.4), {}, "must hold integer class labels"),
        (np.zeros((6, 8, 8), np.uint8), {"site": np.zeros((6, 2))}, "one value per image"),
    ],
)
def test_bad_npz_seg_files_are_user_errors(tmp_path, masks, extra, message):
    masks = masks.copy()
    if masks.dtype == np.uint8 and masks.max() == 255:
        masks[:, :4] = 0  # a 0/255 binary mask
    path = write_npz(tmp_path / "s.npz", images=np.zeros((6, 8, 8), np.uint8), masks=masks, **extra)
    with pytest.raises(FedkitError, match=message):
        run({"task": {"name": "npz-seg", "path": path}, "rounds": 1})


def test_npz_path_missing_names_the_expected_layout(tmp_path):
    with pytest.raises(FedkitError, match="Expected layout"):
        run({"task": {"name": "npz", "path": str(tmp_path / "nope.npz")}})


def test_npz_seg_sites_and_splits_from_arrays(tmp_path):
    path = str(npz_seg.write_fake(tmp_path, sites={"A": (15, 5), "B": (10, 0)}))
    fed = prepare(*resolve_config({"task": {"name": "npz-seg", "path": path}}))
    assert set(fed.infos) == {"A", "B"}
    assert fed.infos["A"].num_test == 5
    assert fed.infos["B"].num_test == 2  # carved: task.test_fraction of 10


def test_real_pneumoniamnist_loads_with_official_sizes():
    path = shared_data("medmnist", "pneumoniamnist.npz")
    fed = prepare(*resolve_config({"task": {"name": "npz", "path": str(path)}, "clients": 4}))
    total = {
        k: sum(getattr(c, f"num_{k}") for c in fed.infos.values()) for k in ("train", "val", "test")
    }
    assert total == {"train": 4708, "val": 524, "test": 624}
    assert fed.task.num_classes == 2 and fed.task.image_shape == (28, 28)
