"""ixi: FLamby's IXI-Tiny layout with its metadata csv, resized and z-scored 3D volumes."""

import pytest
import torch

from fedkit_core import run
from fedkit_core.errors import FedkitError
from fedkit_core.tasks.ixi import write_fake


def test_centres_splits_shapes_and_zscore(tmp_path, load):
    write_fake(tmp_path, subjects={"Guys": (3, 1), "HH": (2, 1), "IOP": (2, 1)})
    data = load("ixi", tmp_path, shape=[8, 10, 8])
    assert list(data.sites) == ["Guys", "HH", "IOP"]
    assert {k: len(v) for k, v in data.sites["Guys"].items()} == {"train": 3, "test": 1}
    train = data.sites["Guys"]["train"]
    assert train.images.shape == (3, 1, 8, 10, 8) and train.images.dtype == torch.float32
    assert train.targets.shape == (3, 8, 10, 8) and train.targets.dtype == torch.uint8
    volume = train.images[0]
    assert abs(float(volume.mean())) < 1e-4 and abs(float(volume.std()) - 1) < 0.05
    brain = train.targets[0].bool()
    assert volume[0][brain].mean() > volume[0][~brain].mean() + 1  # the brain is bright
    assert data.normalizer.mean == (0.0,) and data.normalizer.std == (1.0,)


def test_an_edited_metadata_file_is_not_served_from_the_cache(tmp_path, load):
    write_fake(tmp_path, subjects={"Guys": (3, 1)})
    assert len(load("ixi", tmp_path, shape=[8, 10, 8]).sites["Guys"]["train"]) == 3
    csv = tmp_path / "metadata_tiny.csv"
    csv.write_text(
        csv.read_text().replace("train", "x").replace("test", "train").replace("x", "test")
    )
    assert len(load("ixi", tmp_path, shape=[8, 10, 8]).sites["Guys"]["train"]) == 1


def test_missing_metadata_says_where_to_get_it(tmp_path, load):
    write_fake(tmp_path)
    (tmp_path / "metadata_tiny.csv").unlink()
    with pytest.raises(FedkitError, match="metadata_tiny.csv.*flamby/datasets/fed_ixi"):
        load("ixi", tmp_path)


def test_a_3d_unet_trains_a_round(tmp_path):
    write_fake(tmp_path, subjects={"Guys": (2, 1), "HH": (2, 1), "IOP": (2, 1)})
    config = {
        "task": {"name": "ixi", "path": str(tmp_path), "shape": [8, 8, 8]},
        "unet_channels": [4, 8],
        "batch_size": 2,
        "rounds": 1,
        "checkpoint": False,
    }
    results = run(config)
    assert results["task"]["image_shape"] == [8, 8, 8]
    assert set(results.final["clients"]) == {"Guys", "HH", "IOP"}
