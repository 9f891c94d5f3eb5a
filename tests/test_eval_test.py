"""``eval_test``: validation every evaluated round, the test split only where it can matter
(``improved``, the default), with the final and best-round results of ``every``."""

from __future__ import annotations

import pytest

from fedkit_core import run
from fedkit_core.errors import FedkitError
from fedkit_core.results.plots import plot_run
from fedkit_core.results.schema import SCOPES, has_test, metrics_csv
from fedkit_core.testing import tiny

#: validation falls in round 4 of this run (checked below, so the test cannot pass vacuously)
CONFIG = tiny(rounds=5, lr=3e-3)


@pytest.fixture(scope="module")
def runs():
    return run({**CONFIG, "eval_test": "every"}), run(CONFIG)


def test_improved_keeps_final_and_best_results(runs):
    every, improved = runs
    for key in (*SCOPES, "round", "best"):
        assert improved.final[key] == every.final[key], key
    best = 0.0
    for full, record in zip(every.rounds, improved.rounds, strict=True):
        assert record["val"] == full["val"]  # validation every round, as with every
        score = full["val"]["global"]["bacc"]
        expected = score > best or record["round"] == CONFIG["rounds"]
        best = max(best, score)
        assert has_test(record) == expected, record["round"]
        if expected:
            assert {k: record[k] for k in SCOPES} == {k: full[k] for k in SCOPES}
        else:  # honest: no test scores, as in a round not evaluated
            assert record["evaluated"] == ["val"]
            assert record["global"] == record["clients"] == {}
            assert not set(SCOPES[2:]) & set(record)
    skipped = [r["round"] for r in improved.rounds if not has_test(r)]
    assert skipped and len(skipped) < CONFIG["rounds"] - 1


def test_readers_skip_rounds_without_test(runs, tmp_path):
    _, improved = runs
    rows = metrics_csv(improved.rounds).splitlines()
    for record in improved.rounds:
        test_rows = [r for r in rows if r.startswith(f"{record['round']},test,")]
        assert bool(test_rows) == has_test(record)
        assert any(r.startswith(f"{record['round']},val,") for r in rows)
    assert [p.name for p in plot_run(improved, tmp_path)] == ["curves.png", "clients.png"]


def test_eval_test_is_checked():
    with pytest.raises(FedkitError, match="eval_test"):
        run(tiny(rounds=1, eval_test="sometimes"))
