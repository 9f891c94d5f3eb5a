"""Built-in tasks: synthetic determinism, npz file tasks and their error messages."""

import numpy as np
import pytest

from fedkit_core import FedkitError, resolve_config, run
from fedkit_core.api import prepare
from fedkit_core.tasks.registry import all_tasks
from fedkit_core.testing import shared_data, tiny


def test_builtin_tasks_are_registered():
    assert {"synthetic", "synthetic-seg", "npz", "npz-seg"} <= set(all_tasks())


def test_synthetic_is_deterministic_per_seed_and_long_tailed():
    a = prepare(*resolve_config(tiny(seed=3)))
    b = prepare(*resolve_config(tiny(seed=3)))
    assert a.task.clients == b.task.clients
    counts = np.sum([c.class_counts for c in a.task.clients.values()], axis=0)
    assert counts.max() >= 2.5 * counts.min()
    assert a.task.shot_groups and set(a.task.shot_groups) == {"head", "medium", "tail"}


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_npz_classification_with_grey_and_rgb_images(tmp_path):
    rng = np.random.default_rng(0)
    for shape in ((40, 8, 8), (40, 8, 8, 3)):
        path = write_npz(
            tmp_path / "d.npz",
            train_images=rng.integers(0, 255, shape, dtype=np.uint8),
            train_labels=rng.integers(0, 3, (40, 1)),
            test_images=rng.integers(0, 255, shape, dtype=np.uint8)[:12],
            test_labels=rng.integers(0, 3, 12),
        )
        fed = prepare(*resolve_config({"task": {"name": "npz", "path": path}, "clients": 2}))
        assert fed.task.in_channels == (1 if len(shape) == 3 else 3)
        assert sum(c.num_test for c in fed.task.clients.values()) == 12


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


def test_npz_path_missing_names_the_expected_layout(tmp_path):
    with pytest.raises(FedkitError, match="Expected layout"):
        run({"task": {"name": "npz", "path": str(tmp_path / "nope.npz")}})


def test_npz_seg_sites_and_splits_from_arrays(tmp_path):
    rng = np.random.default_rng(0)
    n = 30
    path = write_npz(
        tmp_path / "s.npz",
        images=rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8),
        masks=rng.integers(0, 2, (n, 16, 16)),
        site=np.array(["A"] * 20 + ["B"] * 10),
        split=np.array((["train"] * 15 + ["test"] * 5) + ["train"] * 10),
    )
    fed = prepare(*resolve_config({"task": {"name": "npz-seg", "path": path}}))
    assert set(fed.task.clients) == {"A", "B"}
    assert fed.task.clients["A"].num_test == 5
    assert fed.task.clients["B"].num_test == 2  # carved: task.test_fraction of 10


def test_real_pneumoniamnist_loads_with_official_sizes():
    path = shared_data("medmnist", "pneumoniamnist.npz")
    fed = prepare(*resolve_config({"task": {"name": "npz", "path": str(path)}, "clients": 4}))
    total = {
        k: sum(getattr(c, f"num_{k}") for c in fed.task.clients.values())
        for k in ("train", "val", "test")
    }
    assert total == {"train": 4708, "val": 524, "test": 624}
    assert fed.task.num_classes == 2 and fed.task.image_shape == (28, 28)
