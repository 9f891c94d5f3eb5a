"""Metrics against scikit-learn / hand computation, and fairness."""

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

from fedkit_core.metrics import (
    classification_metrics,
    fairness,
    per_sample_dice,
    segmentation_metrics,
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
