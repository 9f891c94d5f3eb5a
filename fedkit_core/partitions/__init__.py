"""Turn a task's data into clients, each with its own train/val/test splits.

* ``sites``: one client per site, with the site's own splits.
* ``iid``, ``dirichlet``, ``class-dirichlet``, ``fractions``: the sites' data is pooled, the
  training pool is split with the chosen partitioner, and the pooled val and test sets are
  shared out so that each client's val/test follows its own class mix (client k receives
  the same share of class c's test samples as of its training samples). Every sample of the
  pooled test set thus belongs to exactly one client.

Missing splits are carved out: test from train (``task.test_fraction``, per site), val from
each client's train (``task.val_fraction``).
"""

from __future__ import annotations

import numpy as np

from fedkit_core.config import Config
from fedkit_core.contract.data import CLASSIFICATION, ClientData, Split, TaskData
from fedkit_core.errors import FedkitError
from fedkit_core.partitions import splitters

KINDS = ("sites", "iid", "dirichlet", "class-dirichlet", "fractions")
LABEL_KINDS = ("dirichlet", "class-dirichlet")


def resolve_kind(config: Config, data: TaskData) -> str:
    kind = config["partition.kind"]
    if kind == "auto":
        return "sites" if data.has_sites else "iid"
    if kind == "sites" and not data.has_sites:
        raise FedkitError(
            f"task {config['task.name']!r} has no sites; use partition.kind=iid, dirichlet, "
            "class-dirichlet or fractions"
        )
    if kind in LABEL_KINDS and data.kind != CLASSIFICATION:
        raise FedkitError(f"partition.kind={kind} needs class labels; use sites, iid or fractions")
    return kind


def partition(data: TaskData, config: Config) -> dict[str, ClientData]:
    """One :class:`ClientData` per client, deterministic for ``config['seed']``."""
    kind = resolve_kind(config, data)
    rng = np.random.default_rng([int(config["seed"]), 77])
    test_fraction = config["task.test_fraction"]
    sites = {name: _with_test(splits, test_fraction, rng) for name, splits in data.sites.items()}
    if kind == "sites":
        if config["clients"] not in (None, len(sites)):
            raise FedkitError(
                f"the task has {len(sites)} sites but clients={config['clients']}; with "
                "partition.kind=sites the clients are the sites (drop --clients)"
            )
        clients = {name: dict(splits) for name, splits in sites.items()}
        for splits in clients.values():
            if "val" not in splits or len(splits["val"]) == 0:
                splits["train"], splits["val"] = _carve(
                    splits["train"], config["task.val_fraction"], rng
                )
    else:
        clients = _split_pool(data, sites, kind, config, rng)
    result = {}
    for cid, splits in clients.items():
        result[cid] = ClientData(cid, splits, data.num_classes, data.normalizer, data.augment)
        if len(splits["train"]) == 0:
            raise FedkitError(f"client {cid!r} received no training data; use fewer clients")
    return result


def _split_pool(
    data: TaskData, sites: dict[str, dict[str, Split]], kind: str, config: Config, rng
) -> dict[str, dict[str, Split]]:
    pool = {
        split: Split.concat([s[split] for s in sites.values() if split in s])
        for split in ("train", "val", "test")
        if any(split in s for s in sites.values())
    }
    fractions = config["partition.fractions"]
    num = config["clients"] or (len(fractions) if kind == "fractions" and fractions else 4)
    train = pool["train"]
    labels = train.targets.numpy() if data.kind == CLASSIFICATION else None
    n = len(train)
    if num > n:
        raise FedkitError(f"clients={num} exceeds the {n} training samples")
    if kind == "iid":
        parts = splitters.iid(labels, n, num, rng)
    elif kind == "fractions":
        if not fractions:
            raise FedkitError("partition.kind=fractions needs partition.fractions=[f1,f2,...]")
        parts = splitters.fractions(labels, n, num, rng, fractions)
    elif kind == "dirichlet":
        parts = splitters.dirichlet(
            labels, n, num, rng, config["partition.alpha"], config["partition.min_size"]
        )
    else:
        alphas = config["partition.alphas"]
        if not alphas:
            raise FedkitError("partition.kind=class-dirichlet needs partition.alphas=[a0,a1,...]")
        parts = splitters.class_dirichlet(
            labels, n, num, rng, alphas, config["partition.drop_prob"], config["partition.min_size"]
        )
    ids = [f"c{k}" for k in range(num)]
    held = {
        split: _follow(pool[split], parts, labels, data, rng)
        for split in ("val", "test")
        if split in pool
    }
    # a client without val samples holds out a share of its own training samples (the
    # same draws, in the same order, as carving each client's train split would make)
    carved: dict[int, np.ndarray] = {}
    for k, idx in enumerate(parts):
        if "val" not in held or len(held["val"][k]) == 0:
            keep, out = _carve_index(len(idx), config["task.val_fraction"], rng)
            parts[k], carved[k] = idx[keep], idx[out]
    clients = {cid: {"train": s} for cid, s in zip(ids, train.subsets(parts))}
    for split, index in held.items():
        for cid, part in zip(ids, pool[split].subsets(index)):
            clients[cid][split] = part
    for k, part in zip(carved, train.subsets(list(carved.values()))):
        clients[ids[k]]["val"] = part
    return clients


def _follow(split: Split, parts: list[np.ndarray], labels, data: TaskData, rng) -> list[np.ndarray]:
    """Share ``split`` out with each client's per-class share of the training pool."""
    num = len(parts)
    out: list[list[np.ndarray]] = [[] for _ in range(num)]
    if labels is None:
        share = np.array([len(p) for p in parts], dtype=float)
        groups = [(np.arange(len(split)), share / share.sum())]
    else:
        targets = split.targets.numpy()
        counts = np.stack([np.bincount(labels[p], minlength=data.num_classes) for p in parts])
        groups = []
        for c in range(data.num_classes):
            total = counts[:, c].sum()
            share = counts[:, c] / total if total else np.full(num, 1.0 / num)
            groups.append((np.flatnonzero(targets == c), share))
    for idx, share in groups:
        for k, chunk in enumerate(splitters.allocate(rng.permutation(idx), share)):
            out[k].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.array([], dtype=int) for p in out]


def _with_test(splits: dict[str, Split], fraction: float, rng) -> dict[str, Split]:
    splits = dict(splits)
    if "test" not in splits or len(splits["test"]) == 0:
        splits["train"], splits["test"] = _carve(splits["train"], fraction, rng)
    return splits


def _carve(split: Split, fraction: float, rng) -> tuple[Split, Split]:
    """Random ``fraction`` of ``split`` (at least one sample) held out."""
    keep, out = _carve_index(len(split), fraction, rng)
    return split.subset(keep), split.subset(out)


def _carve_index(n: int, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """The kept and the held-out positions (each sorted) of carving ``fraction`` of ``n``."""
    order = rng.permutation(n)
    held = max(1, int(round(fraction * n))) if n > 1 else 0
    return np.sort(order[held:]), np.sort(order[:held])
