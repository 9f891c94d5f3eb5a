"""Failure scenarios in simulated time: a site that drops out mid-run, a straggler ten times
slower, a site that joins late. In every aggregation mode the run survives, its records say
what happened (outages, late updates, stale ones) and no round goes missing."""

from __future__ import annotations

import pytest

from fedkit_core import run
from fedkit_core.testing import tiny

pytestmark = pytest.mark.slow

SCENARIOS = {
    "base": {"samples_per_second": 100},
    "profiles": {
        "late-joiner": {"availability": {"join": 2}},  # site0: joins after 2 s
        "vpn-drop": {"availability": {"down": [[1.5, 6.5]]}},  # site1: drops for 5 s
        "straggler": {"compute": "0.1x"},  # site2
    },
    "clients": {"site0": "late-joiner", "site1": "vpn-drop", "site2": "straggler"},
}


def outages(results):
    """``(client, from, to)`` of the outages that held work up."""
    return {(o["client"], o["from"], o["to"]) for r in results.rounds for o in r.get("outages", [])}


@pytest.mark.parametrize("mode", ["sync", "deadline", "fedbuff"])
def test_the_run_survives_every_scenario_and_says_what_happened(mode):
    config = tiny(rounds=4, sites=SCENARIOS, aggregation=mode)
    if mode == "deadline":
        config["deadline"] = 2.0
    results = run(config)
    assert results["status"] == "complete"
    assert [r["round"] for r in results.rounds] == [1, 2, 3, 4]
    assert results.final["global"] and results.final["simulated_seconds"] > 0
    times = [r["simulated_seconds"] for r in results.rounds]
    assert times == sorted(times)
    said = outages(results)
    assert ("site0", 0.0, 2.0) in said  # the late joiner's setup waited for it
    events = results["events"]
    if mode == "sync":  # every round waits for every site
        assert said >= {("site0", 0.0, 2.0), ("site1", 1.5, 6.5)} and events == []
        assert all(set(r["train"]) == {"site0", "site1", "site2"} for r in results.rounds)
    if mode == "deadline":  # the late are dropped, each drop recorded: no update goes unsaid
        for record in results.rounds:
            missed = {e["client"] for e in events if e["round"] == record["round"]}
            assert set(record["train"]) | missed == set(record["sampled"])
        assert {e["client"] for e in events} >= {"site2"}
        assert all("missed the deadline" in e["error"] for e in events)
    if mode == "fedbuff":  # the others go on; the straggler's updates come in stale
        updates = [u for r in results.rounds for u in r["updates"]]
        assert len(updates) == 12 and events == []
        slow = [u for u in updates if u["client"] == "site2"]
        assert len(slow) < len(updates) / 3
        assert all(u["staleness"] >= 1 for u in slow)
