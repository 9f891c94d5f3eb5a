"""Classification metrics as scikit-learn defines them: bacc, bauc, acc, f1_macro, head/medium/tail accuracy.

``bauc`` is the mean one-vs-rest ROC-AUC over the classes present in the evaluated set
(classes with both positives and negatives), computed with plain scikit-learn; FCA's code
interpolates TPR on a 1000-point FPR grid instead, which differs in the third decimal.
Shot-group accuracies are the mean per-class recall over the group's classes present in
the evaluated set.

The scores are computed here with the same numpy operations scikit-learn 1.9 performs
(``balanced_accuracy_score``, ``f1_score(average="macro", zero_division=0)``, binary
``roc_auc_score``), so they are bitwise the same (``tests/test_performance.py`` checks it),
without scikit-learn's input validation and import: profiling the default run (3 rounds,
evaluation every round, on a loaded 2-core machine), its metric calls took 25 s and its
import 34 s of the server's 60 s of metrics, and the import adds 108 MiB of resident memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def classification_metrics(
    probs: np.ndarray, labels: np.ndarray, shot_groups: Mapping[str, Sequence[int]] | None = None
) -> dict[str, float]:
    if len(labels) == 0:
        return {}
    labels = labels.astype(int)
    pred = probs.argmax(axis=1)
    out = {
        "acc": float((pred == labels).mean()),
        "bacc": balanced_accuracy(labels, pred),
        "f1_macro": f1_macro(labels, pred),
    }
    aucs = [
        binary_auc(labels == c, probs[:, c])
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


def _counts(labels: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class of ``union(labels, pred)`` (sorted): true positives, true and predicted counts."""
    classes = np.union1d(labels, pred)
    t, p = np.searchsorted(classes, labels), np.searchsorted(classes, pred)
    k = len(classes)
    tp = np.bincount(t[t == p], minlength=k)
    return tp, np.bincount(t, minlength=k), np.bincount(p, minlength=k)


def balanced_accuracy(labels: np.ndarray, pred: np.ndarray) -> float:
    """Mean recall over the classes present in ``labels`` (scikit-learn's definition)."""
    tp, true, _ = _counts(labels, pred)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_class = tp / true
    return float(np.mean(per_class[~np.isnan(per_class)]))


def f1_macro(labels: np.ndarray, pred: np.ndarray) -> float:
    """Unweighted mean F1 over the classes in ``labels`` or ``pred`` (never 0/0)."""
    tp, true, predicted = _counts(labels, pred)
    f1 = (2.0 * tp.astype(np.float64)) / (1.0 * true.astype(np.float64) + predicted)
    return float(np.nanmean(f1))


def binary_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC-AUC of ``score`` for the boolean ``positive`` (both classes present): the
    trapezoidal area under the ROC curve with collinear points dropped, as scikit-learn's
    ``roc_curve`` + ``auc`` compute it."""
    order = np.argsort(score, kind="stable")[::-1]
    score, hits = score[order], positive[order].astype(np.float64)
    idx = np.r_[np.flatnonzero(np.diff(score)), len(score) - 1]
    tps = np.cumsum(hits, dtype=np.float64)[idx]
    fps = 1 + idx.astype(np.float64) - tps
    if len(fps) > 2:
        keep = np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True]
        fps, tps = fps[keep], tps[keep]
    fps, tps = np.r_[0.0, fps], np.r_[0.0, tps]
    return float(np.trapezoid(tps / tps[-1], fps / fps[-1]))
