"""Paired differences over seeds: is a method's gain over its baseline more than seed noise?

Two runs with the same seed share the partition, the initial model and the client sampling
(each is drawn from its own stream derived from the seed, see
:func:`fedkit_core.hooks.context.derive_seed`), so the per-seed differences
``d_k = method_k - baseline_k`` remove the seed-to-seed spread the two runs have in common.
:func:`paired_difference` reports their mean with two 95% confidence intervals:

* **paired t**: ``mean(d) ± t_{0.975, n-1} * sd(d) / sqrt(n)`` (``sd`` with ddof 1), exact when
  the differences are normal; wide for few seeds (``t_{0.975, 1}`` = 12.7 for two seeds).
* **bootstrap**: the 2.5 and 97.5 percentiles of the mean of ``n`` differences drawn with
  replacement, ``resamples`` times, from a generator with a fixed seed (so a table is
  reproducible). No normality assumption, but too narrow for few seeds (with two seeds it is
  just the range of the two differences).

A difference is called **significant** only with at least 3 seeds and when *both* intervals
exclude 0, so neither interval's weakness alone can make noise look like a gain. ``wins``/``ties``/``losses``
count the seeds where the method is better / equal (within ``1e-12``) / worse than the
baseline, with ``higher_is_better`` telling which way is better (``False`` for a fairness
std or a wall time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from fedkit_core.errors import FedkitError

#: bootstrap resamples and the fixed seed of their generator
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
#: fewer seeds never make a difference significant (the project claims gains on >= 3)
MIN_SEEDS_SIGNIFICANT = 3
#: per-seed differences within this are ties
TIE = 1e-12


def paired_difference(
    values: Sequence[float],
    baseline: Sequence[float],
    *,
    higher_is_better: bool = True,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    bounds: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """``values - baseline`` seed by seed: ``mean``, ``per_seed``, ``ci_t`` and
    ``ci_bootstrap`` (``[low, high]``), ``wins``, ``ties``, ``losses``, ``significant``,
    ``better`` (``"higher"``/``"lower"``), ``seeds`` (n); see the module docstring.

    ``bounds``: the range ``(low, high)`` of each value (``(0, 1)`` for a bACC), so that a
    difference lies in ``[low - high, high - low]``: the t-interval, which few seeds make
    wider than that, is clipped to it (``clipped`` says whether it was); clipping never
    changes whether it excludes 0."""
    if np.ndim(values) != 1 or np.ndim(baseline) != 1 or len(values) != len(baseline):
        raise FedkitError(
            f"paired differences need one value per seed on both sides, got {len(values)} "
            f"and {len(baseline)}"
        )
    d = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = len(d)
    if n < 2:
        raise FedkitError(f"paired differences need at least 2 seeds, got {n}")
    mean = float(d.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    boot = [float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))]
    sign = 1.0 if higher_is_better else -1.0
    ci_t = [mean - half, mean + half]
    clipped = False
    if bounds is not None and np.isfinite(half):
        span = float(bounds[1] - bounds[0])
        inside = [max(ci_t[0], -span), min(ci_t[1], span)]
        clipped, ci_t = inside != ci_t, inside
    return {
        "mean": mean,
        "per_seed": d.tolist(),
        "ci_t": ci_t,
        "ci_bootstrap": boot,
        "wins": int((sign * d > TIE).sum()),
        "ties": int((np.abs(d) <= TIE).sum()),
        "losses": int((sign * d < -TIE).sum()),
        "significant": bool(
            n >= MIN_SEEDS_SIGNIFICANT and excludes_zero(ci_t) and excludes_zero(boot)
        ),
        "better": "higher" if higher_is_better else "lower",
        "seeds": n,
        **({"clipped": clipped} if bounds is not None else {}),
    }


def excludes_zero(interval: Sequence[float]) -> bool:
    """Whether a ``[low, high]`` interval lies entirely on one side of 0."""
    low, high = interval
    return low > 0 or high < 0
