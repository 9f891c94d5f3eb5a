"""npz-seg: a split value of "all" means the sample is not split (val/test are carved)."""

import numpy as np

from fedkit_core.federation import prepare
from fedkit_core.resolve import resolve_config


def test_unsplit_site_gets_carved_splits(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "seg.npz"
    np.savez(
        path,
        images=rng.integers(0, 255, (30, 8, 8), dtype=np.uint8),
        masks=rng.integers(0, 2, (30, 8, 8), dtype=np.uint8),
        site=np.array(["a"] * 10 + ["b"] * 20),
        split=np.array(["train"] * 6 + ["test"] * 4 + ["all"] * 20),
    )
    cfg, plugins = resolve_config({"task": {"name": "npz-seg", "path": str(path)}})
    sizes = {
        cid: (c.num_train, c.num_val, c.num_test) for cid, c in prepare(cfg, plugins).infos.items()
    }
    assert sizes["a"][2] == 4
    assert sum(sizes["b"]) == 20 and sizes["b"][1] > 0 and sizes["b"][2] > 0
