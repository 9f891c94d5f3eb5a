"""Embedding fedkit in another code base: build a run from a dict, add your own hook, read results.

python examples/embed.py
"""

from __future__ import annotations

import numpy as np

from fedkit_core import run
from fedkit_core.plugin import hookimpl


class WorstClassRecall:
    """An application-specific metric, added without writing a package: the lowest per-class
    recall, computed on the server from the pooled prediction arrays (evaluation=pooled) or
    from the summed confusion matrices (evaluation=federated)."""

    @hookimpl
    def fedkit_metrics(self, server, arrays):
        if "confusion" in arrays:
            confusion = arrays["confusion"]
            present = confusion.sum(1) > 0
            recalls = np.diag(confusion)[present] / confusion.sum(1)[present]
        elif "probs" in arrays:
            labels, pred = arrays["labels"], arrays["probs"].argmax(1)
            recalls = [float((pred[labels == c] == c).mean()) for c in np.unique(labels)]
        else:
            return None
        return {"worst_class_recall": float(min(recalls))}


def main() -> None:
    config = {
        "task": {"name": "synthetic", "sites": 3},
        "rounds": 5,
        "loss": "bsm",
        "partition": {"kind": "sites"},
    }
    results = run(config, plugins={"worst-class": WorstClassRecall()})
    final = results.final
    print(
        f"global bACC {final['global']['bacc']:.3f}, "
        f"worst class recall {final['global']['worst_class_recall']:.3f}"
    )
    for client, metrics in final["clients"].items():
        print(f"  {client}: bACC {metrics['bacc']:.3f}")
    print(f"fairness: std {final['fairness']['std']:.3f}, worst {final['fairness']['worst']:.3f}")


if __name__ == "__main__":
    main()
