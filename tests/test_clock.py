"""The virtual clock: durations from profiles and bytes, outages that pause a site's work,
synchronous rounds with and without a deadline, and simulated time in a run's records
(deterministic, resumable, and without changing what a synchronous run computes)."""

from __future__ import annotations

import pytest

from fedkit_core import resume, run
from fedkit_core.contract.messages import Message
from fedkit_core.engines.clock import Clock, Downtime
from fedkit_core.sites import Availability, SiteProfile
from fedkit_core.testing import InterruptAfter, tiny


def profile(speed=100.0, download=1e6, upload=1e6, latency=0.0, **availability) -> SiteProfile:
    return SiteProfile("p", speed, download, upload, latency, Availability(**availability))


def test_a_message_takes_latency_transfers_and_training():
    clock = Clock(
        {"a": profile(speed=50, download=1000, upload=500, latency=0.1)}, seed=0, local_epochs=2
    )
    # 2 x 0.1 s latency + 1000 B / 1000 B/s + 500 B / 500 B/s + 2 epochs x 25 samples / 50
    assert clock.work("a", 1000, 500, 2 * 25) == pytest.approx(0.2 + 1 + 1 + 1)
    fit, reply = Message("fit"), Message("fit", scalars={"num_examples": 25})
    assert clock.samples(fit, reply) == 50
    assert clock.samples(Message("query"), reply) == 0
    assert clock.samples(fit, Message("fit", error="boom")) == 0


def test_an_outage_pauses_a_sites_work_and_is_noted():
    clock = Clock({"a": profile(down=((10.0, 30.0),))}, seed=0, local_epochs=1)
    assert clock.finish("a", 0.0, 5.0) == 5.0  # done before the outage
    assert clock.outages == []
    assert clock.finish("a", 8.0, 5.0) == 33.0  # 2 s, paused 20 s, then 3 s
    clock.busy_until.clear()
    assert clock.finish("a", 15.0, 1.0) == 31.0  # sent while down: waits until it is back
    assert clock.take_outages() == [{"client": "a", "from": 10.0, "to": 30.0, "waited": 35.0}]
    assert not clock.is_up("a", 12.0) and clock.is_up("a", 30.0)
    assert clock.next_up("a", 12.0) == 30.0 and clock.next_up("a", 40.0) == 40.0


def test_a_busy_site_starts_the_next_message_when_it_is_free():
    clock = Clock({"a": profile()}, seed=0, local_epochs=1)
    assert clock.finish("a", 0.0, 10.0) == 10.0
    assert clock.finish("a", 4.0, 1.0) == 11.0


def test_random_failures_are_the_same_whatever_is_asked_first():
    availability = Availability(failure_rate=1 / 600, repair=60.0)
    one, two = Downtime(availability, seed=5), Downtime(availability, seed=5)
    late = list(_take(one.after(50_000.0), 3))
    early = list(_take(two.after(0.0), 200))
    assert all(o in early for o in late)
    assert early == sorted(early) and all(b - a == 60.0 for a, b in early)
    assert list(_take(Downtime(availability, seed=6).after(0.0), 5)) != early[:5]
    gaps = [b2 - b1 for (b1, _), (b2, _) in zip(early, early[1:])]
    assert 400 < sum(gaps) / len(gaps) < 900  # mean time between failures ~ 600 + 60 s


def _take(items, n):
    for _, item in zip(range(n), items):
        yield item


def test_a_synchronous_exchange_ends_with_its_last_reply_and_a_deadline_drops_the_late():
    profiles = {"fast": profile(speed=100), "slow": profile(speed=10)}
    messages = {cid: Message("fit") for cid in profiles}
    replies = {cid: Message("fit", scalars={"num_examples": 100}) for cid in profiles}
    sizes = dict.fromkeys(profiles, (0, 0))
    clock = Clock(profiles, seed=0, local_epochs=1)
    clock.exchange(messages, dict(replies), sizes)
    assert clock.now == pytest.approx(10.0)
    clock = Clock(profiles, seed=0, local_epochs=1, deadline=5.0)
    got = clock.exchange(messages, dict(replies), sizes)
    assert got["fast"].error is None and "missed the deadline" in got["slow"].error
    assert clock.now == pytest.approx(5.0)  # the server waited until the deadline
    assert clock.busy_until["slow"] == pytest.approx(10.0)  # the site finishes its work
    # the next round: the slow site is still busy past this deadline, so its message
    # expires unread (not sent, no work) and the round waits out the deadline
    sent, expired = clock.admit(messages)
    assert set(sent) == {"fast"} and "expired unread" in expired["slow"].error
    clock.exchange(sent, {"fast": replies["fast"]}, sizes, expired=True)
    assert clock.now == pytest.approx(10.0) and clock.busy_until["slow"] == pytest.approx(10.0)
    # evaluation takes no time; setup keeps a site busy without the server waiting
    clock.exchange({"fast": Message("evaluate")}, {"fast": Message("evaluate")}, sizes)
    clock.exchange({"slow": Message("setup")}, {"slow": Message("setup")}, {"slow": (10**6, 0)})
    assert clock.now == pytest.approx(10.0) and clock.busy_until["slow"] == pytest.approx(11.0)


SITES = {
    "base": {"samples_per_second": 100},
    "profiles": {
        "fast": {"compute": "1x"},
        "slow": {"compute": "0.1x", "upload": "2 Mbit/s"},
    },
    "clients": {"site2": "slow", "*": "fast"},
}


@pytest.mark.slow
def test_simulated_time_is_recorded_and_changes_nothing_a_synchronous_run_computes():
    timed = run(tiny(rounds=3, sites=SITES))
    plain = run(tiny(rounds=3))
    assert timed.final["global"] == plain.final["global"]
    assert [r["train"] for r in timed.rounds] == [r["train"] for r in plain.rounds]
    times = [r["simulated_seconds"] for r in timed.rounds]
    assert 0 < times[0] < times[1] < times[2] == timed.final["simulated_seconds"]
    assert "simulated_seconds" not in plain.final and "simulated_seconds" not in plain.rounds[0]
    # the slow site sets the pace: its samples at 10 per second, every round
    assert times[1] - times[0] == pytest.approx(times[2] - times[1], rel=1e-6)
    assert timeless(timed.rounds) == timeless(run(tiny(rounds=3, sites=SITES)).rounds)


def timeless(records):
    """Round records less their wall time (the only thing that differs between two runs)."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def test_a_deadline_drops_late_updates_and_the_run_goes_on():
    results = run(tiny(rounds=3, sites=SITES, aggregation="deadline", deadline=2.0))
    assert results["status"] == "complete" and len(results.rounds) == 3
    assert all(r["sampled"] == ["site0", "site1", "site2"] for r in results.rounds)
    assert all(set(r["train"]) == {"site0", "site1"} for r in results.rounds)
    late = [e for e in results["events"] if e["client"] == "site2"]
    assert len(late) == 3 and all("missed the deadline" in e["error"] for e in late)
    times = [r["simulated_seconds"] for r in results.rounds]
    assert times[1] - times[0] == pytest.approx(2.0)  # each round waits out its deadline


@pytest.mark.slow
def test_a_run_with_simulated_time_resumes_to_the_uninterrupted_records(tmp_path):
    flaky = {"down": [[0.3, 40]], "failures_per_hour": 60, "repair": 20}
    sites = {**SITES, "profiles": {**SITES["profiles"], "slow": {"availability": flaky}}}
    config = tiny(rounds=3, sites=sites, checkpoint=True, aggregation="deadline", deadline=30.0)
    whole = run(config, out=tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(config, out=tmp_path / "cut", observer=InterruptAfter(1))
    resumed = resume(tmp_path / "cut")
    assert timeless(resumed.rounds) == timeless(whole.rounds)
    assert resumed["events"] == whole["events"]
    assert any("outages" in r for r in whole.rounds)
