"""prostate: the ProstateSlice PNG layout, the NIfTI volumes, and the real per-site samples."""

import pytest
import torch

from fedkit_core import run
from fedkit_core.errors import FedkitError
from fedkit_core.tasks.files import DataWarning
from fedkit_core.tasks.prostate import SITES, write_fake, write_fake_volumes
from fedkit_core.testing import shared_data


def organ_is_bright(split) -> bool:
    images = split.images[:, 0].float()
    organ = split.targets.bool()
    return images[organ].mean() > images[~organ].mean() + 50


def test_slices_give_six_sites_with_dark_masks_as_prostate(tmp_path, load):
    base = write_fake(tmp_path, counts={"train": 3, "val": 1, "test": 2})
    data = load("prostate", tmp_path, image_size=16)  # a parent of ProstateSlice is fine
    assert list(data.sites) == list(SITES)
    assert data.class_names == ["background", "prostate"]
    bidmc = data.sites["BIDMC"]
    assert {k: len(v) for k, v in bidmc.items()} == {"train": 3, "val": 1, "test": 2}
    assert bidmc["train"].images.shape == (3, 1, 16, 16)
    assert bidmc["train"].images.dtype == torch.uint8
    assert all(organ_is_bright(s) for splits in data.sites.values() for s in splits.values())
    assert data.augment is None  # Fed-LWR states no augmentation
    assert base.name == "ProstateSlice"


def test_augment_flips_image_and_mask_together(tmp_path, load):
    write_fake(tmp_path, sites=["BIDMC"], counts={"train": 4})
    data = load("prostate", tmp_path, image_size=16, augment=True)
    train = data.sites["BIDMC"]["train"]
    x, y = train.images.float(), train.targets.long()  # as client batches hand them out
    rng = torch.Generator().manual_seed(0)
    ax, ay = data.augment(x, y, rng)
    assert ax.shape == x.shape and ay.dtype == torch.int64 and type(ax) is torch.Tensor
    changed = [not torch.equal(ax[i], x[i]) for i in range(len(x))]
    assert any(changed)  # some samples were flipped or rotated ...

    def dihedral(t):  # the 8 flips and 90-degree rotations of the last two axes
        for flipped in (t, t.flip(-1)):
            for k in range(4):
                yield flipped.rot90(k, dims=(-2, -1))

    for i in range(len(x)):  # ... each with the same flip/rotation of image and mask
        assert any(
            torch.equal(tx, ax[i]) and torch.equal(ty, ay[i])
            for tx, ty in zip(dihedral(x[i]), dihedral(y[i]))
        )
    again = data.augment(x, y, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], ax)  # the generator decides: resumed runs augment alike


def test_mask_foreground_can_be_forced(tmp_path, load):
    write_fake(tmp_path, sites=["BIDMC", "HK"])
    flipped = load("prostate", tmp_path, image_size=16, mask_foreground="bright", cache="off")
    assert not organ_is_bright(flipped.sites["HK"]["train"])


def test_volumes_are_sliced_split_by_case_and_empty_slices_dropped(tmp_path, load):
    write_fake_volumes(tmp_path, sites=("BIDMC", "HK", "ISBI", "ISBI_1.5"), cases=5)
    data = load("prostate", tmp_path, image_size=16)
    assert list(data.sites) == ["BIDMC", "HK", "RUNMC", "BMC"]  # ISBI folders are renamed
    hk = data.sites["HK"]  # HK's masks end in _Segmentation
    # 5 cases -> 3/1/1 cases; each case has 6 slices, the first and last without prostate
    assert {k: len(v) for k, v in hk.items()} == {"train": 12, "val": 4, "test": 4}
    for split in hk.values():
        assert split.targets.flatten(1).any(dim=1).all()  # no empty slice kept
        assert organ_is_bright(split)
        assert split.images.dtype == torch.uint8 and split.images.max() > 240  # 99.5th pct


def test_missing_layout_names_the_sites_and_source(tmp_path, load):
    (tmp_path / "ProstateSlice" / "Elsewhere").mkdir(parents=True)
    with pytest.raises(FedkitError) as err:
        load("prostate", tmp_path)
    assert "holds no data in the expected layout" in str(err.value)
    assert "BIDMC" in str(err.value) and "liuquande.github.io/SAML" in str(err.value)


def test_site_without_train_pairs_is_an_error(tmp_path, load):
    base = write_fake(tmp_path, sites=["BIDMC", "HK"])
    for mask in (base / "HK" / "train" / "mask").iterdir():
        mask.unlink()
    with (
        pytest.warns(DataWarning, match="HK/train: skipped 3 image"),
        pytest.raises(FedkitError, match="site HK: no image/mask pairs"),
    ):
        load("prostate", tmp_path, image_size=16)


def test_real_samples_load_six_sites(load):
    path = shared_data("seg", "site_samples", "midss_fundus4_prostate6", "ProstateSlice")
    with pytest.warns(DataWarning, match="I2CVB/train.*00_01.png <-> 00_00.png"):
        data = load("prostate", path)
    assert list(data.sites) == list(SITES)
    for site, splits in data.sites.items():
        assert set(splits) == {"train", "test"}, site
        for split in splits.values():
            assert split.images.shape[1:] == (1, 384, 384)
            fraction = split.targets.float().mean()
            assert 0.003 < fraction < 0.05, (site, fraction)  # prostate is the small region


@pytest.mark.realdata
def test_real_samples_run_a_round_with_six_clients():
    path = shared_data("seg", "site_samples", "midss_fundus4_prostate6", "ProstateSlice")
    config = {
        "task": {"name": "prostate", "path": str(path), "image_size": 32, "pairing": "auto"},
        "unet_channels": [4, 8],
        "rounds": 1,
        "checkpoint": False,
    }
    with pytest.warns(DataWarning):
        results = run(config)
    assert len(results.final["clients"]) == 6
    assert 0.0 <= results.final["global"]["dice"] <= 1.0
