"""Metrics against scikit-learn / hand computation, fairness, and federated statistics."""

from functools import reduce

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

from fedkit_core.errors import FedkitError
from fedkit_core.metrics import (
    add_stats,
    classification_metrics,
    classification_stats,
    fairness,
    metrics_from_stats,
    per_sample_dice,
    segmentation_metrics,
    segmentation_stats,
)


def test_classification_metrics_match_sklearn():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 200)
    probs = rng.dirichlet(np.ones(4), 200)
    probs[np.arange(200), labels] += 0.3
    probs /= probs.sum(1, keepdims=True)
    m = classification_metrics(probs, labels)
    pred = probs.argmax(1)
    assert m["bacc"] == pytest.approx(balanced_accuracy_score(labels, pred))
    assert m["acc"] == pytest.approx((pred == labels).mean())
    assert m["f1_macro"] == pytest.approx(f1_score(labels, pred, average="macro"))
    assert m["bauc"] == pytest.approx(
        roc_auc_score(labels, probs, multi_class="ovr", average="macro")
    )


def test_bauc_averages_only_classes_present_in_the_evaluated_set():
    labels = np.array([0, 0, 1, 1])  # class 2 absent
    probs = np.array([[0.8, 0.1, 0.1], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.4, 0.1]])
    m = classification_metrics(probs, labels)
    expected = np.mean(
        [roc_auc_score(labels == 0, probs[:, 0]), roc_auc_score(labels == 1, probs[:, 1])]
    )
    assert m["bauc"] == pytest.approx(expected)


def test_shot_group_accuracy_is_mean_recall_of_present_classes():
    labels = np.array([0, 0, 0, 1, 2, 2])
    probs = np.eye(3)[[0, 0, 1, 1, 2, 0]]
    m = classification_metrics(probs, labels, {"head": [0], "medium": [1], "tail": [2, 3]})
    assert m["head_acc"] == pytest.approx(2 / 3)
    assert m["medium_acc"] == 1.0
    assert m["tail_acc"] == 0.5  # class 3 absent from the set: not counted


def test_dice_per_sample_and_class_with_empty_classes():
    target = torch.zeros(2, 4, 4, dtype=torch.long)
    target[0, :2, :2] = 1  # sample 0: 4 foreground pixels; sample 1: none
    logits = torch.zeros(2, 2, 4, 4)
    logits[0, 1, :2, :1] = 5  # predicts 2 of the 4 pixels
    dice = per_sample_dice(logits, target, 2).numpy()
    assert dice[0, 1] == pytest.approx(2 * 2 / (2 + 4))
    assert dice[1, 1] == 1.0, "absent in both prediction and truth counts as perfect"
    m = segmentation_metrics(dice, ["background", "organ"])
    assert m["dice"] == pytest.approx((dice[0, 1] + 1.0) / 2)
    assert m["dice_bg"] == pytest.approx(dice.mean())


def test_fairness_std_and_worst():
    f = fairness({"a": {"dice": 0.9}, "b": {"dice": 0.7}, "c": {}}, "dice")
    assert f == {"metric": "dice", "std": pytest.approx(0.1), "worst": 0.7, "worst_client": "b"}


EXACT = ("acc", "bacc", "f1_macro", "head_acc", "medium_acc", "tail_acc")
SHOTS = {"head": [0], "medium": [1, 2], "tail": [3, 4]}


def _probs(rng, n, k, scale):
    """Softmax scores of a network that is right more often than not; ``scale`` sharpens."""
    labels = rng.integers(0, k, n)
    logits = scale * (rng.normal(size=(n, k)) + np.eye(k)[labels])
    probs = np.exp(logits - logits.max(1, keepdims=True)).astype(np.float32)
    return probs / probs.sum(1, keepdims=True), labels


def _federated(parts, **kw):
    return metrics_from_stats(reduce(add_stats, parts), **kw)


def assert_pooled_equals_federated(probs, labels, clients) -> None:
    """The clients' summed statistics give the pooled metrics: exact, bauc within 1.5e-3."""
    pooled = classification_metrics(probs, labels, SHOTS)
    fed = _federated(
        [classification_stats(probs[c], labels[c]) for c in clients], shot_groups=SHOTS
    )
    assert fed.keys() == pooled.keys()
    for name in EXACT:
        if name in pooled:
            assert fed[name] == pytest.approx(pooled[name], abs=1e-12), name
    assert fed["bauc"] == pytest.approx(pooled["bauc"], abs=1.5e-3)


@pytest.mark.parametrize("k, scale", [(2, 1.0), (3, 0.3), (4, 3.0), (5, 30.0)])
def test_summed_client_statistics_give_the_pooled_metrics(k, scale):
    rng = np.random.default_rng(k)
    probs, labels = _probs(rng, 400, k, scale)
    assert_pooled_equals_federated(probs, labels, np.array_split(rng.permutation(400), 4))


def test_dirichlet_scores_and_a_class_absent_from_the_labels():
    rng = np.random.default_rng(0)
    labels = rng.choice([0, 1, 3], 300)  # class 2 never occurs, but is predicted
    probs = rng.dirichlet(np.full(4, 0.3), 300)
    probs[np.arange(300), labels] += 0.2
    probs /= probs.sum(1, keepdims=True)
    assert (probs.argmax(1) == 2).any()
    assert_pooled_equals_federated(probs, labels, np.array_split(np.arange(300), 4))


def test_binned_bauc_is_exact_when_no_pair_shares_a_bin_and_bounded_otherwise():
    labels = np.array([0, 0, 1, 1, 1])
    probs = np.array([[0.9, 0.1], [0.4, 0.6], [0.3, 0.7], [0.45, 0.55], [0.1, 0.9]])
    exact = classification_metrics(probs, labels)["bauc"]
    assert metrics_from_stats(classification_stats(probs, labels))["bauc"] == pytest.approx(exact)
    # one bin: every pair is a half, whatever the order
    assert metrics_from_stats(classification_stats(probs, labels, bins=1))["bauc"] == 0.5


def test_saturated_scores_keep_their_order():
    labels = np.array([0, 1, 1])
    probs = np.array([[1.0, 1e-30], [1 - 1e-7, 1e-7], [1 - 1e-12, 1e-12]])
    assert metrics_from_stats(classification_stats(probs, labels))["bauc"] == 1.0


def test_classification_stats_are_counts():
    labels = np.array([0, 1, 1, 2])
    probs = np.eye(3)[[0, 1, 2, 2]] * 0.8 + 0.2 / 3
    stats = classification_stats(probs, labels, bins=10)
    assert stats["confusion"].tolist() == [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    assert stats["score_pos"].shape == stats["score_neg"].shape == (3, 10)
    assert stats["score_pos"].sum(1).tolist() == [1, 2, 1]
    assert stats["score_neg"].sum(1).tolist() == [3, 2, 3]
    assert all(v.dtype == np.int64 for v in stats.values())


def test_segmentation_statistics_are_exact():
    rng = np.random.default_rng(1)
    dice = rng.uniform(size=(50, 3))
    names = ["background", "disc", "cup"]
    parts = [segmentation_stats(d) for d in np.array_split(dice, 4)]
    fed = _federated(parts, class_names=names)
    pooled = segmentation_metrics(dice, names)
    assert fed.keys() == pooled.keys() == {"dice", "dice_bg", "dice_disc", "dice_cup"}
    for name, value in pooled.items():
        assert fed[name] == pytest.approx(value, abs=1e-12), name


def test_empty_statistics_give_no_metrics_and_mismatches_are_errors():
    empty = classification_stats(np.zeros((0, 3)), np.zeros(0))
    assert metrics_from_stats(empty) == {} == classification_metrics(np.zeros((0, 3)), np.zeros(0))
    assert metrics_from_stats(segmentation_stats(np.zeros((0, 2)))) == {}
    with pytest.raises(FedkitError, match="shapes"):
        add_stats(empty, classification_stats(np.zeros((0, 3)), np.zeros(0), bins=10))
    with pytest.raises(FedkitError, match="cannot add"):
        add_stats(empty, segmentation_stats(np.zeros((0, 3))))
    with pytest.raises(FedkitError, match="labels must be in"):
        classification_stats(np.full((2, 2), 0.5), np.array([0, 2]))
