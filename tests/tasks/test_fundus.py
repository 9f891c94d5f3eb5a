"""rif: the DoFE Fundus layout, its RGB mask convention, and the real per-site samples."""

import numpy as np
import pytest
import torch

from fedkit_core import resolve_config, run
from fedkit_core.federation import prepare
from fedkit_core.tasks.fundus import DOMAINS, mask_labels, write_fake
from fedkit_core.testing import shared_data

SITES = list(DOMAINS.values())


def test_mask_values_map_to_background_rim_cup():
    grey = np.array([[255, 128, 0], [250, 130, 3]], np.uint8)
    assert mask_labels(grey).tolist() == [[0, 1, 2], [0, 1, 2]]


def test_four_domains_become_four_named_sites(tmp_path, load):
    write_fake(tmp_path, counts={"train": 3, "test": 2})
    data = load("rif", tmp_path, image_size=16)
    assert list(data.sites) == SITES
    assert data.class_names == ["background", "rim", "cup"]
    for splits in data.sites.values():
        assert {k: len(v) for k, v in splits.items()} == {"train": 3, "test": 2}
        train = splits["train"]
        assert train.images.shape == (3, 3, 16, 16)
        assert set(torch.unique(train.targets).tolist()) == {0, 1, 2}
        # the fake disc is bright (200) and its cup brighter (250) on a dark background
        grey = train.images.float().mean(dim=1)
        assert grey[train.targets == 2].mean() > grey[train.targets == 1].mean() + 20
        assert grey[train.targets == 1].mean() > grey[train.targets == 0].mean() + 100


def test_val_is_a_fifth_of_train_by_default(tmp_path):
    write_fake(tmp_path, counts={"train": 5, "test": 1})
    fed = prepare(
        *resolve_config({"task": {"name": "rif", "path": str(tmp_path), "image_size": 16}})
    )
    sizes = {cid: (c.num_train, c.num_val) for cid, c in fed.infos.items()}
    assert sizes == dict.fromkeys(SITES, (4, 1))


def test_real_samples_keep_the_mask_convention(load):
    path = shared_data("seg", "site_samples", "midss_fundus4_prostate6", "Fundus")
    data = load("rif", path)
    assert list(data.sites) == SITES
    for site, splits in data.sites.items():
        for split in splits.values():
            assert split.images.shape == (1, 3, 384, 384)
            share = torch.bincount(split.targets.flatten(), minlength=3) / split.targets.numel()
            # background dominates; rim and cup are each a few per cent of the crop
            assert share[0] > 0.7 and 0.005 < share[1] < 0.15 and 0.005 < share[2] < 0.2, site


@pytest.mark.slow
@pytest.mark.realdata
def test_real_samples_run_a_round_with_four_clients():
    path = shared_data("seg", "site_samples", "midss_fundus4_prostate6", "Fundus")
    config = {
        "task": {"name": "rif", "path": str(path), "image_size": 32},
        "unet_channels": [4, 8],
        "rounds": 1,
        "checkpoint": False,
    }
    results = run(config)
    assert list(results.final["clients"]) == SITES
    assert {"dice", "dice_rim", "dice_cup"} <= set(results.final["global"])
