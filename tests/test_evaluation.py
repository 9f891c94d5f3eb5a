"""Evaluation modes: pooled (predictions go up) and federated (only sufficient statistics)."""

from __future__ import annotations

import pytest

from fedkit_core import run
from fedkit_core.testing import shared_data, tiny, tiny_seg

pytestmark = pytest.mark.slow

#: metrics that federated evaluation computes exactly from its statistics (bauc is binned)
EXACT = ("bacc", "acc", "f1_macro", "head_acc", "medium_acc", "tail_acc", "dice", "dice_bg")


def _compare(pooled: dict, federated: dict, auc_tolerance: float) -> None:
    assert set(pooled) == set(federated)
    for metric, value in pooled.items():
        tolerance = auc_tolerance if metric == "bauc" else 1e-6  # float32 sums
        assert federated[metric] == pytest.approx(value, abs=tolerance), metric


@pytest.mark.slow
@pytest.mark.parametrize("config", [tiny(rounds=2), tiny_seg(rounds=1)], ids=["cls", "seg"])
def test_federated_evaluation_matches_pooled(config):
    # bauc is binned (see fedkit_core.metrics.statistics): on these few dozen test samples
    # the default 1000 bins put some positive/negative pairs in one bin, an error that
    # depends on the CPU's last bits (2.0e-3 global, 1.07e-2 for a client on one machine,
    # under 1e-3 on another); 4000 bins gave 4e-4 and 1.5e-3 there
    pooled = run({**config, "evaluation": "pooled"})
    federated = run({**config, "evaluation": "federated", "evaluation_bins": 4000})
    assert federated.final["global"]
    _compare(pooled.final["global"], federated.final["global"], auc_tolerance=2e-3)
    for cid, metrics in pooled.final["clients"].items():
        # a client's test set here has a few dozen samples of a barely trained model: one
        # positive/negative pair sharing a score bin moves its bauc by up to 1 / (P * N)
        _compare(metrics, federated.final["clients"][cid], auc_tolerance=1e-2)
    assert federated.final["fairness"]["std"] == pytest.approx(
        pooled.final["fairness"]["std"], abs=1e-6
    )


def test_federated_evaluation_sends_no_predictions_or_labels():
    pooled = run(tiny(rounds=1, evaluation="pooled", eval_batch_size=8))
    bigger = run(tiny(rounds=1, evaluation="pooled", task={"head_samples": 48}, eval_batch_size=8))
    federated = run(tiny(rounds=1, evaluation="federated"))
    federated_bigger = run(tiny(rounds=1, evaluation="federated", task={"head_samples": 48}))

    def up(results):
        return sum(c["up"] for c in results.rounds[-1]["bytes"].values())

    # pooled traffic grows with the test sets, federated traffic does not
    assert up(bigger) > up(pooled)
    assert up(federated_bigger) == up(federated)


@pytest.mark.slow
@pytest.mark.realdata
def test_federated_evaluation_on_pneumoniamnist():
    path = shared_data("medmnist/pneumoniamnist.npz")
    config = {
        "task": {"name": "npz", "path": str(path)},
        "clients": 3,
        "rounds": 1,
        "checkpoint": False,
    }
    pooled = run({**config, "evaluation": "pooled"})
    federated = run({**config, "evaluation": "federated"})
    _compare(pooled.final["global"], federated.final["global"], auc_tolerance=2e-3)
