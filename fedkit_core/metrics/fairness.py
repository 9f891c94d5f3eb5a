"""Performance fairness across clients: spread and worst client of one metric."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def fairness(clients: Mapping[str, Mapping[str, float]], metric: str) -> dict[str, object]:
    """``std`` (ddof 0) and ``worst`` (lowest) of ``metric`` across clients that report it."""
    values = {cid: m[metric] for cid, m in clients.items() if metric in m}
    if not values:
        return {}
    worst = min(values, key=values.get)
    return {
        "metric": metric,
        "std": float(np.std(list(values.values()))),
        "worst": float(values[worst]),
        "worst_client": worst,
    }
