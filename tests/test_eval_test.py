"""``eval_test``: validation every evaluated round, the test split only where it can matter
(``improved``, the default), with the final and best-round results of ``every``."""

from __future__ import annotations

import pytest

from fedkit_core import resume, run
from fedkit_core.errors import FedkitError
from fedkit_core.results.plots import plot_run
from fedkit_core.results.schema import SCOPES, has_test, metrics_csv
from fedkit_core.testing import InterruptAfter, tiny

#: validation falls in round 4 and the best round is 5 (checked below: no vacuous pass)
CONFIG = tiny(rounds=6, lr=3e-3)


class Stateful:
    """A plugin: clients may evaluate with state of their own, so improving rounds are
    tested at once instead of keeping the global model for the last round."""

    def fedkit_client_report(self, client):
        return {}


@pytest.fixture(scope="module")
def every():
    return run({**CONFIG, "eval_test": "every"})


@pytest.mark.slow
@pytest.mark.parametrize("plugins", [None, {"stateful": Stateful()}], ids=["global", "plugin"])
def test_improved_keeps_final_and_best_results(every, plugins):
    improved = run(CONFIG, plugins=plugins)
    for key in (*SCOPES, "round", "best"):
        assert improved.final[key] == every.final[key], key
    best, improving = 0.0, []
    for full, record in zip(every.rounds, improved.rounds, strict=True):
        assert record["val"] == full["val"]  # validation every round, as with every
        score = full["val"]["global"]["bacc"]
        if score > best:
            best, improving = score, [*improving, record["round"]]
    assert 1 < len(improving) < CONFIG["rounds"]  # a round without improvement
    last = CONFIG["rounds"]
    # without plugins only the best round and the last are tested, else every improving one
    expected = {improved.final["best"]["round"], last} if plugins is None else {*improving, last}
    for full, record in zip(every.rounds, improved.rounds, strict=True):
        assert has_test(record) == (record["round"] in expected), record["round"]
        if has_test(record):
            assert {k: record[k] for k in SCOPES} == {k: full[k] for k in SCOPES}
        else:  # honest: no test scores, as in a round not evaluated
            assert record["evaluated"] == ["val"]
            assert record["global"] == record["clients"] == {}
            assert not set(SCOPES[2:]) & set(record)
    if plugins is None:
        assert improved.final["best"]["round"] != last  # the kept best model was tested


@pytest.mark.slow
def test_the_kept_best_model_survives_a_resume(every, tmp_path):
    """Interrupted after the best round (5, kept untested), resumed: the last round tests
    the kept model from the server's checkpoint."""
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run({**CONFIG, "checkpoint": True}, out=out, observer=InterruptAfter(5))
    resumed = resume(out)
    assert resumed.final["best"] == every.final["best"]
    assert resumed.final["best"]["round"] == 5


@pytest.mark.slow
def test_readers_skip_rounds_without_test(tmp_path):
    improved = run(CONFIG)
    rows = metrics_csv(improved.rounds).splitlines()
    for record in improved.rounds:
        test_rows = [r for r in rows if r.startswith(f"{record['round']},test,")]
        assert bool(test_rows) == has_test(record)
        assert any(r.startswith(f"{record['round']},val,") for r in rows)
    assert [p.name for p in plot_run(improved, tmp_path)] == ["curves.png", "clients.png"]


def test_eval_test_is_checked():
    with pytest.raises(FedkitError, match="eval_test"):
        run(tiny(rounds=1, eval_test="sometimes"))
