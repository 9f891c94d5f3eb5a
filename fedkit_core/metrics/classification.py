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
    classes, tp, true, predicted = _counts(labels, pred)
    out = {
        "acc": float((pred == labels).mean()),
        "bacc": _balanced_accuracy(tp, true),
        "f1_macro": _f1_macro(tp, true, predicted),
    }
    n = len(labels)
    aucs = [binary_auc(labels == c, probs[:, c]) for c, t in zip(classes, true) if 0 < t < n]
    if aucs:
        out["bauc"] = float(np.mean(aucs))
    if shot_groups:
        # per-class recall of the classes in ``labels`` (tp / true is the mean of hits)
        recall = {int(c): float(h / t) for c, h, t in zip(classes, tp, true) if t > 0}
        for group, classes_of_group in shot_groups.items():
            present = [recall[c] for c in classes_of_group if c in recall]
            if present:
                out[f"{group}_acc"] = float(np.mean(present))
    return out


def _counts(
    labels: np.ndarray, pred: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The classes of ``union(labels, pred)`` (sorted) and per class: true positives, true
    and predicted counts (computed once for every score of a call)."""
    classes = np.union1d(labels, pred)
    t, p = np.searchsorted(classes, labels), np.searchsorted(classes, pred)
    k = len(classes)
    tp = np.bincount(t[t == p], minlength=k)
    return classes, tp, np.bincount(t, minlength=k), np.bincount(p, minlength=k)


def balanced_accuracy(labels: np.ndarray, pred: np.ndarray) -> float:
    """Mean recall over the classes present in ``labels`` (scikit-learn's definition)."""
    _, tp, true, _ = _counts(labels, pred)
    return _balanced_accuracy(tp, true)


def _balanced_accuracy(tp: np.ndarray, true: np.ndarray) -> float:
    present = true > 0
    return float(np.mean(tp[present] / true[present]))


def f1_macro(labels: np.ndarray, pred: np.ndarray) -> float:
    """Unweighted mean F1 over the classes in ``labels`` or ``pred`` (never 0/0)."""
    _, tp, true, predicted = _counts(labels, pred)
    return _f1_macro(tp, true, predicted)


def _f1_macro(tp: np.ndarray, true: np.ndarray, predicted: np.ndarray) -> float:
    f1 = (2.0 * tp.astype(np.float64)) / (1.0 * true.astype(np.float64) + predicted)
    return float(np.nanmean(f1))


def binary_auc(positive: np.ndarray, score: np.ndarray) -> float:
    """ROC-AUC of ``score`` for the boolean ``positive`` (both classes present): the
    trapezoidal area under the ROC curve with collinear points dropped, as scikit-learn's
    ``roc_curve`` + ``auc`` compute it."""
    # np.concatenate where scikit-learn writes np.r_ (the same arrays, without np.r_'s
    # parsing, which took most of the time of a call on a few samples)
    order = np.argsort(score, kind="stable")[::-1]
    score, hits = score[order], positive[order].astype(np.float64)
    idx = np.concatenate((np.flatnonzero(np.diff(score)), [len(score) - 1]))
    tps = np.cumsum(hits, dtype=np.float64)[idx]
    fps = 1 + idx.astype(np.float64) - tps
    if len(fps) > 2:
        keep = np.concatenate(([True], np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), [True]))
        fps, tps = fps[keep], tps[keep]
    fps, tps = np.concatenate(([0.0], fps)), np.concatenate(([0.0], tps))
    return float(np.trapezoid(tps / tps[-1], fps / fps[-1]))
