"""``eval_with_fit``: a round's evaluation travels with the next round's fit messages (one
exchange per round instead of two) and gives the same records as evaluating on its own."""

from __future__ import annotations

import pytest

from fedkit_core import resume, run
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.errors import FedkitError
from fedkit_core.testing import InterruptAfter, tiny

CONFIG = tiny(rounds=5, lr=3e-3)


class Phases(Observer):
    """Counts the exchanges the server announces, by phase."""

    def __init__(self) -> None:
        self.started: list[tuple[int, str]] = []

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None:
        if done == 0:
            self.started.append((round, phase))

    def count(self, phase: str) -> int:
        return sum(p == phase for _, p in self.started)


def without_costs(results) -> list[dict]:
    """The round records without what depends on how messages travel (time, bytes)."""
    return [{k: v for k, v in r.items() if k not in ("seconds", "bytes")} for r in results.rounds]


def both(config: dict, **kwargs):
    """The run evaluating on its own, the run with ``eval_with_fit=true``, and their phases."""
    off, on = Phases(), Phases()
    apart = run({**config, "eval_with_fit": False}, observer=off, **kwargs)
    along = run({**config, "eval_with_fit": True}, observer=on, **kwargs)
    return apart, along, off, on


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [{}, {"eval_test": "every"}, {"eval_every": 2}, {"sample_fraction": 0.5, "task": {"sites": 6}}],
    ids=["improved", "every", "eval_every=2", "sampled"],
)
def test_same_records_with_one_exchange_per_round(extra):
    apart, along, off, on = both({**CONFIG, **extra})
    assert without_costs(along) == without_costs(apart)
    for key in ("global", "clients", "fairness", "best", "round"):
        assert along.final[key] == apart.final[key], key
    evaluated = sum("val" in r for r in apart.rounds)
    assert evaluated > 1
    assert off.count("evaluate") == evaluated
    assert on.count("evaluate") == 1  # the last round alone
    assert on.count("train") == off.count("train") == CONFIG["rounds"]
    # the global model goes down once per round instead of twice (fit, then evaluate)
    assert along.final["bytes"]["down"] < 0.8 * apart.final["bytes"]["down"]


class Private:
    """A plugin: clients evaluate with state of their own, so evaluation stays apart."""

    def fedkit_client_report(self, client):
        return {}


@pytest.mark.slow
def test_runs_with_plugins_evaluate_apart():
    _, along, off, on = both(CONFIG, plugins={"private": Private()})
    assert on.count("evaluate") == off.count("evaluate") == CONFIG["rounds"]
    assert along.final["best"]["round"] >= 1


def test_auto_is_off_in_a_local_run():
    phases = Phases()
    run(CONFIG, observer=phases)
    assert phases.count("evaluate") == CONFIG["rounds"]


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_results(tmp_path):
    """Stopped once round 3 is complete (its evaluation came with round 4's fit, which the
    clients have done): the resumed run redoes round 4 from round 3's checkpoints."""
    config = {**CONFIG, "eval_with_fit": True, "checkpoint": True}
    whole = run(config)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(config, out=out, observer=InterruptAfter(3))
    resumed = resume(out)
    assert without_costs(resumed) == without_costs(whole)
    assert resumed.final["global"] == whole.final["global"]


def failing_once(tmp_path, client: str, round: int):
    """``ClientRuntime._fit`` that raises for ``client`` in ``round`` the first time only
    (a flag file, so that worker processes agree)."""
    flag = tmp_path / "failed"
    fit = ClientRuntime._fit

    def patched(self, message, payload):
        if self.id == client and int(message.scalars["round"]) == round and not flag.exists():
            flag.touch()
            raise FedkitError(f"{client} lost its connection")
        return fit(self, message, payload)

    return patched


@pytest.mark.slow
def test_a_retried_failure_gives_the_same_results(tmp_path, monkeypatch):
    clean = run({**CONFIG, "eval_with_fit": True})
    monkeypatch.setattr(ClientRuntime, "_fit", failing_once(tmp_path, "site1", 3))
    retried = run({**CONFIG, "eval_with_fit": True, "client_retries": 1})
    assert (tmp_path / "failed").exists()
    assert retried["events"] == []
    assert without_costs(retried) == without_costs(clean)


def test_a_dropped_client_misses_both_parts(tmp_path, monkeypatch):
    """A client whose combined message fails misses round 3's fit and round 2's
    evaluation; the run goes on with the others."""
    monkeypatch.setattr(ClientRuntime, "_fit", failing_once(tmp_path, "site1", 3))
    results = run({**CONFIG, "eval_with_fit": True, "min_clients": 1})
    assert [(e["round"], e["phase"], e["client"]) for e in results["events"]] == [
        (2, "evaluate", "site1"),
        (3, "fit", "site1"),
    ]
    assert "site1" not in results.rounds[1]["val"]["clients"]
    assert "site1" not in results.rounds[2]["train"]
    assert "site1" in results.rounds[3]["val"]["clients"]


@pytest.mark.slow
def test_on_flower_the_records_are_the_local_engine_s():
    pytest.importorskip("flwr")
    config = {**CONFIG, "rounds": 3, "eval_with_fit": True}
    local = run(config)
    phases = Phases()
    flower = run({**config, "engine": "flower", "flower": {"backend": "thread"}}, observer=phases)
    assert phases.count("evaluate") == 1
    for mine, theirs in zip(flower.rounds, local.rounds, strict=True):
        assert mine["train"] == theirs["train"]
        assert _close(mine["val"]["global"], theirs["val"]["global"])
    assert _close(flower.final["global"], local.final["global"])


def _close(a: dict, b: dict) -> bool:
    """Equal metrics up to float rounding (Flower's records carry float32 arrays)."""
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-6 for k in a)


def test_the_option_is_checked():
    with pytest.raises(FedkitError, match="eval_with_fit"):
        run(tiny(rounds=1, eval_with_fit="sometimes"))
    phases = Phases()  # `--set eval_with_fit=true` (YAML reads a bool) and the text alike
    run(tiny(rounds=2, eval_with_fit="true"), observer=phases)
    assert phases.count("evaluate") == 1
