"""medmnist: flags through the medmnist package, offline from task.path."""

import numpy as np
import pytest

from fedkit_core.errors import FedkitError
from fedkit_core.tasks.medmnist import write_fake
from fedkit_core.testing import shared_data

pytest.importorskip("medmnist", reason="the medmnist package (fedkit[medmnist]) is not installed")


def test_real_pneumoniamnist_with_class_names(load):
    folder = shared_data("medmnist")
    data = load("medmnist", folder, flag="pneumoniamnist")
    assert data.class_names == ["normal", "pneumonia"]
    splits = data.sites["all"]
    assert {k: len(v) for k, v in splits.items()} == {"train": 4708, "val": 524, "test": 624}
    assert np.bincount(splits["train"].targets.numpy()).tolist() == [1214, 3494]
    assert splits["train"].images.shape[1:] == (1, 28, 28)


def test_real_retinamnist_is_rgb_and_long_tailed(load):
    data = load("medmnist", shared_data("medmnist"), flag="retinamnist")
    assert len(data.class_names) == 5
    train = data.sites["all"]["train"]
    assert train.images.shape[1:] == (3, 28, 28)
    assert np.bincount(train.targets.numpy()).tolist() == [486, 128, 206, 194, 66]


def test_fake_file_and_errors(tmp_path, load):
    write_fake(tmp_path, flag="breastmnist")
    data = load("medmnist", tmp_path, flag="breastmnist")
    assert data.class_names == ["malignant", "normal, benign"]
    with pytest.raises(FedkitError, match="pneumoniamnist.npz is not there.*task.download=true"):
        load("medmnist", tmp_path)  # default flag, no file, no download
    with pytest.raises(FedkitError, match="unknown MedMNIST flag"):
        load("medmnist", tmp_path, flag="nosuchmnist")
    with pytest.raises(FedkitError, match="multi-label"):
        load("medmnist", tmp_path, flag="chestmnist")
    with pytest.raises(FedkitError, match="3D"):
        load("medmnist", tmp_path, flag="organmnist3d")
