"""Class-folder tasks: hyperkvasir, oct-c8, kvasir-v2 and pneumonia-cxr."""

import numpy as np
import pytest

from fedkit_core.federation import prepare
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks import classfolders, hyperkvasir, kvasir_v2, oct_c8, pneumonia
from fedkit_core.tasks.files import DataWarning


def labels_match_pixels(split) -> bool:
    """The fakes encode each image's label in its grey level: 40 + 20 * label."""
    means = split.images.float().mean(dim=(1, 2, 3))
    return bool(((means - 40 - 20 * split.targets).abs() < 6).all())


def test_oct_c8_split_folders_grey_and_readable_names(tmp_path, load):
    oct_c8.write_fake(tmp_path, per_class=2)
    data = load("oct-c8", tmp_path, image_size=12)
    assert data.class_names[:3] == [
        "age-related macular degeneration",
        "choroidal neovascularization",
        "central serous retinopathy",
    ]
    assert data.class_names[-1] == "healthy"
    splits = data.sites["all"]
    assert {k: len(v) for k, v in splits.items()} == {"train": 16, "val": 16, "test": 16}
    assert splits["train"].images.shape[1:] == (1, 12, 12)
    assert all(labels_match_pixels(s) for s in splits.values())
    assert not data.has_sites


def test_kvasir_v2_flat_tree_gets_a_stratified_test_fold(tmp_path, load):
    kvasir_v2.write_fake(tmp_path, per_class=5)
    folds = [load("kvasir-v2", tmp_path, image_size=8, fold=f).sites["all"] for f in range(5)]
    for splits in folds:
        assert len(splits["train"]) == 32 and len(splits["test"]) == 8
        assert np.bincount(splits["test"].targets.numpy()).tolist() == [1] * 8
        assert labels_match_pixels(splits["train"]) and labels_match_pixels(splits["test"])
    # the five test folds are disjoint and cover every image once
    test_images = np.concatenate([s["test"].images.numpy() for s in folds])
    assert len(np.unique(test_images.reshape(40, -1), axis=0)) == 40


def test_hyperkvasir_nested_tree_and_shot_groups(tmp_path):
    hyperkvasir.write_fake(tmp_path, per_class=5)
    config, _ = resolve_config(
        {
            "task": {"name": "hyperkvasir", "path": str(tmp_path), "image_size": 8},
            "task.shot_thresholds": [8, 4],
        }
    )
    assert resolve_config({"task": "hyperkvasir"})[0]["task.shot_thresholds"] == [700, 70]
    fed = prepare(config, None)
    assert len(fed.task.class_names) == 23
    assert fed.task.class_names[0] == "barrett's esophagus"
    assert "ulcerative colitis grade 0 1" in fed.task.class_names
    # the server derives the groups from the class counts clients send at setup
    from fedkit_core.engines.server import shot_groups

    counts = sum(np.asarray(data.info().class_counts) for data in fed.clients.values())
    groups = shot_groups(counts, config["task.shot_thresholds"])
    assert sorted(groups["head"] + groups["medium"] + groups["tail"]) == list(range(23))


def test_pneumonia_inside_the_kaggle_archive(tmp_path, load):
    pneumonia.write_fake(tmp_path / "archive", per_class=3)
    classfolders.write_fake_folders(tmp_path / "archive" / "__MACOSX", ["NORMAL"], per_class=1)
    data = load("pneumonia-cxr", tmp_path, image_size=10)
    assert data.class_names == ["normal", "pneumonia"]
    assert len(data.sites["all"]["val"]) == 6 and labels_match_pixels(data.sites["all"]["test"])


def test_pneumonia_fedhelp_partition_follows_the_fractions(tmp_path):
    pneumonia.write_fake(tmp_path, per_class=50, splits=("train", "test"))
    config, _ = resolve_config(
        {
            "task": {"name": "pneumonia-cxr", "path": str(tmp_path), "image_size": 8},
            "partition.preset": "fedhelp",
        }
    )
    fed = prepare(config, None)
    sizes = [c.num_train + c.num_val for c in fed.infos.values()]
    assert sizes == [60, 20, 8, 6, 4, 2]


def test_unexpected_class_folders_are_reported(tmp_path, load):
    classes = ("NORMAL", "PNEUMONIA", "COVID")
    pneumonia.write_fake(tmp_path, per_class=2, splits=("train", "test"), classes=classes)
    with pytest.warns(DataWarning, match=r"unexpected \['COVID'\]"):
        data = load("pneumonia-cxr", tmp_path, image_size=8)
    assert data.class_names == ["COVID", "normal", "pneumonia"]
