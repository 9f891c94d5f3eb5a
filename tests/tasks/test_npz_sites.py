"""A classification ``.npz`` with ``site`` arrays: the sites become the clients."""

import numpy as np
import pytest

from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks import npz


def with_sites(tmp_path, **extra) -> str:
    """The fake npz (40 train, 12 test images) plus the given arrays."""
    path = npz.write_fake(tmp_path)
    arrays = dict(np.load(path))
    np.savez(path, **arrays, **extra)
    return str(path)


def test_site_arrays_make_the_sites_clients(tmp_path, load):
    train_site = np.array([7, 7, 9] * 13 + [8])  # numbers are site names too
    test_site = np.array(["9", "8", "7"] * 4)
    path = with_sites(tmp_path, site=train_site, test_site=test_site)
    data = load("npz", path)
    assert data.has_sites and list(data.sites) == ["7", "9", "8"]
    assert {k: len(v) for k, v in data.sites["7"].items()} == {"train": 26, "test": 4}
    assert {k: len(v) for k, v in data.sites["8"].items()} == {"train": 1, "test": 4}
    arrays = np.load(path)
    nine = arrays["train_labels"].reshape(-1)[train_site == 9]
    assert data.sites["9"]["train"].targets.tolist() == nine.tolist()


def test_sites_are_the_default_partition(tmp_path):
    sites = np.array(["a", "b"] * 20)
    path = with_sites(tmp_path, site=sites, test_site=np.array(["a", "b"] * 6))
    config, _ = resolve_config({"task": {"name": "npz", "path": path}})
    fed = prepare(config, None)
    assert list(fed.clients) == ["a", "b"]
    assert [fed.infos[c].num_test for c in ("a", "b")] == [6, 6]
    assert fed.infos["a"].num_train + fed.infos["a"].num_val == 20


def test_without_site_arrays_the_file_is_one_pool(tmp_path, load):
    assert not load("npz", npz.write_fake(tmp_path)).has_sites


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"site": np.array(["a", "b"] * 20)}, "no test_site for its test images"),
        ({"site": np.array(["a"] * 39), "test_site": np.array(["a"] * 12)}, r"one site per train"),
        ({"site": np.full((40, 2), "a"), "test_site": np.array(["a"] * 12)}, r"shape \(40, 2\)"),
        (
            {"site": np.array(["a"] * 40), "test_site": np.array(["a", "b"] * 6)},
            r"the sites \['b'\] have val or test images but no train",
        ),
    ],
)
def test_bad_site_arrays_are_explained(tmp_path, load, extra, message):
    with pytest.raises(FedkitError, match=message):
        load("npz", with_sites(tmp_path, **extra))


def test_members_the_task_does_not_use_are_never_decompressed(tmp_path, load, monkeypatch):
    """Before: every member was read whole (a 3 GB unused one: maxrss 3.4 GB)."""
    path = npz.write_fake(tmp_path)
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    np.savez_compressed(path, **arrays, unused=np.zeros(4 << 20, dtype=np.uint8))
    read = []
    real = np.lib.npyio.NpzFile.__getitem__
    monkeypatch.setattr(
        np.lib.npyio.NpzFile, "__getitem__", lambda self, key: read.append(key) or real(self, key)
    )
    data = load("npz", path)
    assert data.num_classes == 3 and "unused" not in read and "train_images" in read


def test_a_member_larger_than_the_limit_is_refused_before_it_is_decompressed(
    tmp_path, load, monkeypatch
):
    path = npz.write_fake(tmp_path)
    monkeypatch.setattr(npz, "member_limit", lambda: 1000)  # smaller than train_images
    read = []
    real = np.lib.npyio.NpzFile.__getitem__
    monkeypatch.setattr(
        np.lib.npyio.NpzFile, "__getitem__", lambda self, key: read.append(key) or real(self, key)
    )
    with pytest.raises(FedkitError, match="its member train_images would take .* it is not read"):
        load("npz", path)
    assert read == []
