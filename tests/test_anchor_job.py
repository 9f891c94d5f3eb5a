"""benchmarks/anchor_job.py's paired summary: the geometric mean of per-repeat ratios with a
confidence interval that brackets it, treats a ratio and its reciprocal alike, and tightens
when the repeats agree."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("anchor_job", ROOT / "benchmarks/anchor_job.py")
aj = importlib.util.module_from_spec(spec)
sys.modules.setdefault("anchor_job", aj)
spec.loader.exec_module(aj)


def test_paired_ratio_is_the_geometric_mean_of_per_repeat_ratios():
    ratio, low, high = aj.paired_ratio([2.0, 4.5, 1.0], [1.0, 3.0, 1.0])
    assert ratio == pytest.approx((2.0 * 1.5 * 1.0) ** (1 / 3))
    assert low < ratio < high


def test_paired_ratio_of_the_swapped_pair_is_the_reciprocal():
    values, baseline = [2.4, 2.6, 2.2, 2.5], [2.0, 2.3, 2.1, 2.0]
    ratio, low, high = aj.paired_ratio(values, baseline)
    back, back_low, back_high = aj.paired_ratio(baseline, values)
    assert back == pytest.approx(1 / ratio)
    assert (back_low, back_high) == pytest.approx((1 / high, 1 / low))


def test_paired_ratio_removes_drift_both_modes_share():
    # both modes slow down together from repeat to repeat; their ratio is always 1.2
    baseline = [1.5, 2.3, 1.9, 2.8]
    ratio, low, high = aj.paired_ratio([1.2 * b for b in baseline], baseline)
    assert (ratio, low, high) == pytest.approx((1.2, 1.2, 1.2))
    # paired wrongly (the baseline's repeats reversed), the same times give the same
    # geometric mean but an interval as wide as the runs' own spread
    wrong = aj.paired_ratio([1.2 * b for b in baseline], baseline[::-1])
    assert wrong[0] == pytest.approx(1.2)
    assert wrong[2] - wrong[1] > 0.5
