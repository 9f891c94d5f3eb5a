"""Has a run converged? How much its validation curve still moves at the end.

A comparison ranks methods by their final round; that ranking means something only once the
curves have flattened. fedkit's rule, applied to every runspec of a comparison: take the
validation curve of the main metric (the scope the ``best`` round is chosen on: the global
model when there is one, else the clients' mean), averaged over the seeds, and look at its
evaluated rounds in the **last fifth** of the run. The curve has converged when its
least-squares trend over that stretch (slope times the stretch's length in rounds) moves
less than ``tolerance`` (0.005 by default). The trend, not the first-to-last difference, is
used because a validation set of a hundred images moves by a few thousandths from one round
to the next even at a fixed model quality; ``spread`` (largest minus smallest value over
the stretch) is reported beside it so the noise is visible too, and so is the trend's
standard error (from the residuals around the fitted line): where it exceeds the tolerance,
the curve's round-to-round noise is too large for the rule to tell a flat curve from a
moving one over that stretch, and a "NOT converged" says little. The error is reported, not
judged: the rule stays the trend against the tolerance.

With fewer than two evaluated rounds in the last fifth (``eval_every`` too coarse, or a run
of one or two rounds) nothing can be said: ``converged`` is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: the default largest movement of a converged curve over its last fifth
TOLERANCE = 0.005
#: the share of the rounds at the end of a run that is looked at
TAIL = 0.2


def validation_curve(results: Mapping[str, Any]) -> dict[int, float]:
    """``{round: validation main metric}`` of one run, on the scope its best round is chosen
    on (``global``, or ``clients_mean`` where there is no global model)."""
    main = results["task"]["main_metric"]
    scope = results["final"].get("best", {}).get("scope") or "global"
    curve = {}
    for record in results["rounds"]:
        val = record.get("val") or {}
        value = (val.get(scope) or {}).get(main)
        if value is None and scope == "global":  # no global model: the clients' mean
            value = (val.get("clients_mean") or {}).get(main)
        if value is not None and np.isfinite(value):
            curve[int(record["round"])] = float(value)
    return curve


def mean_curve(runs: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """The seed-mean validation curve over the rounds every run evaluated."""
    curves = [validation_curve(r) for r in runs]
    common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return {r: float(np.mean([c[r] for c in curves])) for r in common}


def convergence(
    runs: Sequence[Mapping[str, Any]], tolerance: float = TOLERANCE, tail: float = TAIL
) -> dict[str, Any]:
    """How much the seed-mean validation curve of ``runs`` (one runspec's seeds) moves over
    the last ``tail`` of the rounds: ``trend`` (least-squares slope times the stretch's
    length), ``spread`` (max - min), the ``rounds`` looked at, ``tolerance`` and
    ``converged`` (``abs(trend) < tolerance``; ``None`` when fewer than two rounds of the
    stretch were evaluated), and ``trend_se``, the trend's standard error (None with fewer
    than three rounds)."""
    curve = mean_curve(runs)
    last = max((_planned_rounds(r) for r in runs), default=0)
    start = last - tail * last
    rounds = [r for r in curve if r >= start]
    out: dict[str, Any] = {"rounds": rounds, "tolerance": tolerance, "tail": tail}
    if len(rounds) < 2:
        return {**out, "trend": None, "trend_se": None, "spread": None, "converged": None}
    x, values = np.array(rounds, dtype=float), np.array([curve[r] for r in rounds])
    slope, intercept = (float(v) for v in np.polyfit(x, values, 1))
    span = rounds[-1] - rounds[0]
    trend_se = None
    if len(rounds) > 2:
        residual = values - (slope * x + intercept)
        variance = float(residual @ residual) / (len(rounds) - 2)
        trend_se = float(np.sqrt(variance / float(((x - x.mean()) ** 2).sum()))) * span
    return {
        **out,
        "trend": slope * span,
        "trend_se": trend_se,
        "spread": float(values.max() - values.min()),
        "converged": bool(abs(slope * span) < tolerance),
    }


def _planned_rounds(results: Mapping[str, Any]) -> int:
    """The rounds a run was configured for (its last recorded round if the config is absent)."""
    planned = (results.get("config") or {}).get("rounds")
    if planned is None:
        return max((int(r["round"]) for r in results.get("rounds", [])), default=0)
    return int(planned)


def convergence_note(found: Mapping[str, Mapping[str, Any]]) -> str:
    """One sentence per comparison: which runspecs converged by the rule above."""
    if not found:
        return ""
    parts = []
    for spec, c in found.items():
        if c["converged"] is None:
            parts.append(f"{spec}: too few evaluated rounds in the last fifth to tell")
        else:
            state = "converged" if c["converged"] else "NOT converged"
            se = c.get("trend_se")
            noisy = se is not None and se > c["tolerance"]
            parts.append(
                f"{spec}: {state} (trend {c['trend']:+.4f}"
                + (f" ± {se:.4f}" if se is not None else "")
                + f", spread {c['spread']:.4f} over rounds {c['rounds'][0]}-{c['rounds'][-1]}"
                + (": noise larger than the tolerance" if noisy else "")
                + ")"
            )
    tol = next(iter(found.values()))["tolerance"]
    return (
        "Convergence (the seed-mean validation curve of the main metric over the last fifth "
        f"of the rounds; converged when its least-squares trend moves less than {tol}; "
        "± the trend's standard error): " + "; ".join(parts) + "."
    )
