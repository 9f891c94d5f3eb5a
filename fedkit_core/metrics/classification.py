"""Classification metrics (scikit-learn): bacc, bauc, acc, f1_macro, head/medium/tail accuracy.

``bauc`` is the mean one-vs-rest ROC-AUC over the classes present in the evaluated set
(classes with both positives and negatives), computed with plain scikit-learn; FCA's code
interpolates TPR on a 1000-point FPR grid instead, which differs in the third decimal.
Shot-group accuracies are the mean per-class recall over the group's classes present in
the evaluated set.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np


def classification_metrics(
    probs: np.ndarray, labels: np.ndarray, shot_groups: Mapping[str, Sequence[int]] | None = None
) -> dict[str, float]:
    from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

    if len(labels) == 0:
        return {}
    labels = labels.astype(int)
    pred = probs.argmax(axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = {
            "acc": float((pred == labels).mean()),
            "bacc": float(balanced_accuracy_score(labels, pred)),
            "f1_macro": float(f1_score(labels, pred, average="macro", zero_division=0)),
        }
        aucs = [
            roc_auc_score(labels == c, probs[:, c])
            for c in np.unique(labels)
            if 0 < (labels == c).sum() < len(labels)
        ]
    if aucs:
        out["bauc"] = float(np.mean(aucs))
    if shot_groups:
        recall = {c: float((pred[labels == c] == c).mean()) for c in np.unique(labels)}
        for group, classes in shot_groups.items():
            present = [recall[c] for c in classes if c in recall]
            if present:
                out[f"{group}_acc"] = float(np.mean(present))
    return out
