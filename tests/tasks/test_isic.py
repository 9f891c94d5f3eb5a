"""isic2019: FLamby's preprocessed images and train_test_split csv, six centres."""

import pytest

from fedkit_core.errors import FedkitError
from fedkit_core.tasks.isic import CENTRES, write_fake


def test_centres_keep_the_official_split_and_labels(tmp_path, load):
    write_fake(tmp_path, per_centre=4)
    data = load("isic2019", tmp_path, image_size=16)
    assert list(data.sites) == list(CENTRES)
    assert len(data.class_names) == 8 and data.class_names[0] == "melanoma"
    for c, splits in enumerate(data.sites.values()):
        assert {k: len(v) for k, v in splits.items()} == {"train": 3, "test": 1}
        train = splits["train"]
        assert train.images.shape == (3, 3, 16, 16)
        assert train.targets.tolist() == [(c + k) % 8 for k in range(3)]
        # the fakes encode the label in the grey level: 40 + 20 * label
        means = train.images.float().mean(dim=(1, 2, 3))
        assert ((means - 40 - 20 * train.targets).abs() < 6).all()


def test_missing_split_csv_names_flamby(tmp_path, load):
    write_fake(tmp_path)
    (tmp_path / "train_test_split").unlink()
    with pytest.raises(FedkitError, match="dataset_creation_scripts/train_test_split"):
        load("isic2019", tmp_path)


def test_missing_images_are_counted(tmp_path, load):
    write_fake(tmp_path)
    next((tmp_path / "ISIC_2019_Training_Input_preprocessed").glob("*.jpg")).unlink()
    with pytest.raises(FedkitError, match="1 images listed in train_test_split are not in"):
        load("isic2019", tmp_path)
