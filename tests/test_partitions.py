"""Partitioners: sizes, label skew, class removal, fractions, and val/test following train."""

import numpy as np
import pytest
import torch

from fedkit_core.config import CORE_OPTIONS, resolve
from fedkit_core.contract.data import CLASSIFICATION, Normalizer, Split, TaskData
from fedkit_core.errors import FedkitError
from fedkit_core.partitions import partition, splitters


def pool(n=600, classes=5, seed=0, with_val=True):
    rng = np.random.default_rng(seed)

    def split(m):
        labels = torch.from_numpy(rng.integers(0, classes, m))
        return Split(torch.zeros(m, 1, 4, 4, dtype=torch.uint8), labels)

    splits = {"train": split(n), "test": split(n // 3)}
    if with_val:
        splits["val"] = split(n // 6)
    return TaskData(
        CLASSIFICATION,
        [f"k{c}" for c in range(classes)],
        {"all": splits},
        has_sites=False,
        normalizer=Normalizer((0.0,), (1.0,)),
    )


def config(**values):
    layer = {"task.name": "npz", **values}
    return resolve([layer], CORE_OPTIONS)


def test_iid_splits_everything_once_in_equal_sizes():
    parts = splitters.iid(None, 103, 4, np.random.default_rng(0))
    assert sorted(len(p) for p in parts) == [25, 26, 26, 26]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(103))


def test_dirichlet_small_alpha_skews_labels_and_respects_min_size():
    labels = np.repeat(np.arange(5), 200)
    parts = splitters.dirichlet(
        labels, len(labels), 5, np.random.default_rng(0), alpha=0.1, min_size=20
    )
    assert min(len(p) for p in parts) >= 20
    shares = np.stack([np.bincount(labels[p], minlength=5) / len(p) for p in parts])
    assert shares.max(axis=1).mean() > 0.6  # each client dominated by few classes
    iid = splitters.dirichlet(
        labels, len(labels), 5, np.random.default_rng(0), alpha=1000.0, min_size=20
    )
    iid_shares = np.stack([np.bincount(labels[p], minlength=5) / len(p) for p in iid])
    assert np.abs(iid_shares - 0.2).max() < 0.08


def test_class_dirichlet_removes_classes_but_keeps_each_class_somewhere():
    labels = np.repeat(np.arange(5), 300)
    rng = np.random.default_rng(3)
    parts = splitters.class_dirichlet(labels, len(labels), 10, rng, [50, 30, 10, 5, 0.5], 0.3, 10)
    counts = np.stack([np.bincount(labels[p], minlength=5) for p in parts])
    assert (counts == 0).sum() > 5, "some classes are missing from some clients"
    assert (counts.sum(axis=0) == 300).all(), "every sample is assigned exactly once"


def test_fractions_follow_the_given_sizes_per_class():
    labels = np.repeat([0, 1], [300, 700])
    parts = splitters.fractions(labels, 1000, 3, np.random.default_rng(0), [0.6, 0.3, 0.1])
    assert [len(p) for p in parts] == [600, 300, 100]
    assert np.bincount(labels[parts[2]]).tolist() == [30, 70]
    with pytest.raises(FedkitError, match="3 clients"):
        splitters.fractions(labels, 1000, 3, np.random.default_rng(0), [0.5, 0.5])


def test_val_and_test_follow_each_clients_class_mix():
    data = pool()
    clients = partition(
        data, config(**{"partition.kind": "dirichlet", "partition.alpha": 0.2, "clients": 4})
    )
    total_test = sum(len(c["test"]) for c in clients.values())
    assert total_test == len(data.sites["all"]["test"])
    for c in clients.values():
        train = c["train"].class_counts(5)
        test = c["test"].class_counts(5)
        assert ((train == 0) <= (test == 0)).all(), (
            "no test samples of a class the client never trained on"
        )
        assert len(c["val"]) > 0


def test_partition_is_deterministic_per_seed_and_differs_across_seeds():
    data = pool()
    a = partition(data, config(**{"partition.kind": "dirichlet", "clients": 3, "seed": 1}))
    b = partition(data, config(**{"partition.kind": "dirichlet", "clients": 3, "seed": 1}))
    c = partition(data, config(**{"partition.kind": "dirichlet", "clients": 3, "seed": 2}))
    assert all(torch.equal(a[k]["train"].targets, b[k]["train"].targets) for k in a)
    assert any(len(a[k]["train"]) != len(c[k]["train"]) for k in a)


def test_missing_val_is_carved_from_each_clients_train():
    data = pool(with_val=False)
    clients = partition(
        data, config(**{"partition.kind": "iid", "clients": 3, "task.val_fraction": 0.2})
    )
    for c in clients.values():
        assert len(c["val"]) == pytest.approx(0.2 * (len(c["train"]) + len(c["val"])), abs=1)


def test_sites_partition_refuses_pooled_data_and_wrong_client_count():
    with pytest.raises(FedkitError, match="has no sites"):
        partition(pool(), config(**{"partition.kind": "sites"}))
    data = pool()
    data.has_sites = True
    with pytest.raises(FedkitError, match="clients are the sites"):
        partition(data, config(**{"partition.kind": "sites", "clients": 3}))
