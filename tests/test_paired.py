"""Paired differences in ``fedkit compare``: the statistics against a hand computation, and
seeds paired by construction (same partition, initial model and client sampling per seed
whatever the runspec)."""

import hashlib
import json

import numpy as np
import pytest
import torch

from fedkit_core import FedkitError, federation
from fedkit_core.comparison import compare
from fedkit_core.engines.server import Server
from fedkit_core.metrics.paired import paired_difference
from fedkit_core.testing import tiny


def test_paired_t_interval_and_counts_by_hand():
    d = paired_difference([0.5, 0.7, 0.6, 0.9], [0.4, 0.5, 0.6, 0.5])
    # d = 0.1, 0.2, 0.0, 0.4: mean 0.175, sd (ddof 1) sqrt(0.0875 / 3) = 0.1707825,
    # t(0.975, 3) = 3.182446 (tables), half-width 3.182446 * 0.170783 / 2 = 0.271753
    assert d["mean"] == pytest.approx(0.175)
    assert d["per_seed"] == pytest.approx([0.1, 0.2, 0.0, 0.4])
    assert d["ci_t"] == pytest.approx([0.175 - 0.271753, 0.175 + 0.271753], abs=2e-6)
    assert (d["wins"], d["ties"], d["losses"]) == (3, 1, 0)
    assert not d["significant"]  # the t interval contains 0
    assert d["ci_bootstrap"][0] <= d["mean"] <= d["ci_bootstrap"][1]


def test_bootstrap_of_two_seeds_is_their_range_and_reproducible():
    # resampled means are d1, (d1 + d2) / 2, d2 with probabilities 1/4, 1/2, 1/4
    d = paired_difference([1.0, 3.0], [0.0, 0.0])
    assert d["ci_bootstrap"] == [1.0, 3.0]
    assert d["ci_t"] == pytest.approx([2.0 - 12.706205, 2.0 + 12.706205], abs=1e-5)
    assert not d["significant"]  # never with fewer than 3 seeds
    assert paired_difference([1.0, 3.0], [0.0, 0.0]) == d


def test_a_consistent_gain_is_significant_and_direction_counts():
    gain = paired_difference([0.6, 0.61, 0.62, 0.6, 0.61], [0.5, 0.5, 0.5, 0.5, 0.5])
    assert gain["significant"] and gain["ci_t"][0] > 0 and gain["ci_bootstrap"][0] > 0
    assert (gain["wins"], gain["losses"]) == (5, 0)
    lower = paired_difference([0.6, 0.61, 0.62], [0.5, 0.5, 0.5], higher_is_better=False)
    assert (lower["wins"], lower["losses"], lower["better"]) == (0, 3, "lower")


def test_paired_difference_refuses_unpaired_input():
    with pytest.raises(FedkitError):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(FedkitError):
        paired_difference([1.0], [1.0])


def _digest(state) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode() + state[key].detach().cpu().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_seeds_are_paired_across_runspecs(tmp_path, monkeypatch):
    """Two runspecs that train differently (lr, local epochs) see, seed by seed, the same
    partition, initial global model and sampled clients; another seed sees others."""
    seen: dict[str, list[str]] = {"partition": [], "init": []}
    split = federation.partition

    def partition(data, config):
        clients = split(data, config)
        labels = [c["train"].targets.numpy().tobytes() for c in clients.values()]
        seen["partition"].append(hashlib.sha256(b"".join(labels)).hexdigest())
        return clients

    setup = Server.setup

    def spy_setup(self, priors=None):
        setup(self, priors)
        seen["init"].append(_digest(self.ctx.global_state))

    monkeypatch.setattr(federation, "partition", partition)
    monkeypatch.setattr(Server, "setup", spy_setup)
    other = tmp_path / "other.yaml"
    other.write_text("lr: 0.01\nlocal_epochs: 2\n")
    base = tiny(
        rounds=3,
        clients=4,
        sample_fraction=0.5,
        partition={"kind": "dirichlet", "alpha": 0.5},
        task={"sites": 1},
    )
    torch.manual_seed(123)  # the runs must not depend on the global stream either
    found = compare(["fedavg", str(other)], seeds=[0, 1], out=tmp_path / "cmp", base=[base])
    # plan order: fedavg seed 0, seed 1, then other seed 0, seed 1
    for kind in ("partition", "init"):
        assert seen[kind][0] == seen[kind][2] and seen[kind][1] == seen[kind][3], kind
        assert seen[kind][0] != seen[kind][1], kind
    sampled = {
        (spec, seed): [
            r["sampled"]
            for r in json.loads(
                (tmp_path / "cmp" / spec / f"seed{seed}" / "results.json").read_text()
            )["rounds"]
        ]
        for spec in ("fedavg", "other")
        for seed in (0, 1)
    }
    assert sampled["fedavg", 0] == sampled["other", 0] != sampled["fedavg", 1]
    assert sampled["fedavg", 1] == sampled["other", 1]
    # the runs themselves differ, and compare.json holds their paired differences
    table = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    diff = table["diff"][str(other)]["final.global.bacc"]
    a, b = (np.array(table[s]["final.global.bacc"]["per_seed"]) for s in ("fedavg", str(other)))
    assert diff["per_seed"] == pytest.approx((b - a).tolist()) and np.any(b != a)
    assert set(found.diff) == {str(other)}
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "Paired differences to fedavg" in md and f"{other}: global bACC" in md
    assert "Batch norm: fedavg: averaged with the model" in md
    assert found.bn == {"fedavg": "average", str(other): "average"}
