"""FedBuff and FedAsync: the server updates of their papers from the updates as they
arrive in simulated time, the plugins whose aggregation allows them (and the reason for the
others), determinism, resume, and the runspec syntax of ``fedkit compare``."""

from __future__ import annotations

import pytest
import torch

from fedkit_core import hookimpl, resume, run
from fedkit_core.config import resolve as resolve_layers
from fedkit_core.contract.data import CLASSIFICATION, TaskInfo
from fedkit_core.contract.messages import Message
from fedkit_core.engines.asynchronous import staleness_weight
from fedkit_core.engines.modes import round_options
from fedkit_core.engines.server import Server
from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.results.compare import runspec_layer
from fedkit_core.testing import InterruptAfter, tiny

IDS = ["p0", "p1", "p2"]
STEP = {"p0": 1.0, "p1": 10.0, "p2": 100.0}  # what each client adds to the model it gets
SIZE = {"p0": 10, "p1": 20, "p2": 20}
SITES = {  # p2 five times slower: its updates arrive stale
    "base": {"samples_per_second": 100},
    "profiles": {"fast": {"compute": "1x"}, "slow": {"compute": "0.2x"}},
    "clients": {"p2": "slow", "*": "fast"},
}


class Adding:
    """A transport whose client k answers a fit with the model it got plus ``STEP[k]``."""

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        return {
            cid: Message("fit", {"w": m.arrays["w"] + STEP[cid]}, {"num_examples": SIZE[cid]})
            for cid, m in messages.items()
        }


def server_of(**config) -> Server:
    cfg, plugins = resolve_config(tiny(**{"sites": SITES, **config}))
    task = TaskInfo("toy", CLASSIFICATION, ["a", "b"], 1, (2, 2), IDS)
    server = Server(cfg, plugins, task, torch.device("cpu"))
    server.ctx.global_state = {"w": torch.zeros(2, dtype=torch.float64)}
    return server


def test_fedbuff_applies_staleness_weighted_changes_every_buffer():
    server = server_of(aggregation="fedbuff", rounds=6)
    rounds = [server.mode.train(server, Adding(), r) for r in range(1, 7)]
    updates = [u for r in rounds for u in r["updates"]]
    assert [len(r["updates"]) for r in rounds] == [3] * 6  # a round: 3 updates
    assert all(r["server_updates"] == 1 for r in rounds)  # buffer = concurrency = 3
    # the fast clients come back more often; the slow one's update is stale
    assert sum(u["client"] == "p2" for u in updates) < sum(u["client"] == "p0" for u in updates)
    assert max(u["staleness"] for u in updates if u["client"] == "p2") >= 1
    x = 0.0
    for k in range(0, len(updates), 3):  # FedBuff with FedAvg's weights (num_examples)
        buffer = updates[k : k + 3]
        total = sum(SIZE[u["client"]] for u in buffer)
        x += sum(SIZE[u["client"]] / total * u["weight"] * STEP[u["client"]] for u in buffer)
        assert all(u["weight"] == pytest.approx((1 + u["staleness"]) ** -0.5) for u in buffer)
    assert server.ctx.global_state["w"].tolist() == pytest.approx([x, x])


def test_fedasync_mixes_each_update_in_as_it_arrives():
    server = server_of(aggregation="fedasync", rounds=2)
    versions = [0.0]  # the global model after each server update
    for rnd in (1, 2):
        record = server.mode.train(server, Adding(), rnd)
        assert record["server_updates"] == 3
        for u in record["updates"]:
            assert u["weight"] == pytest.approx(0.6 * (1 + u["staleness"]) ** -0.5)
            trained = versions[u["version"]] + STEP[u["client"]]
            versions.append((1 - u["weight"]) * versions[-1] + u["weight"] * trained)
    assert server.ctx.global_state["w"].tolist() == pytest.approx([versions[-1]] * 2)


def test_a_round_without_staleness_is_fedavg():
    server = server_of(aggregation="fedbuff", sites=None, rounds=1)
    record = server.mode.train(server, Adding(), 1)
    assert [u["staleness"] for u in record["updates"]] == [0, 0, 0]
    expected = sum(SIZE[c] * STEP[c] for c in IDS) / sum(SIZE.values())
    assert server.ctx.global_state["w"].tolist() == pytest.approx([expected] * 2)


class EqualAdding(Adding):
    """:class:`Adding` with clients of one size (their replies take the same time)."""

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        replies = super().send(messages)
        for reply in replies.values():
            reply.scalars["num_examples"] = 20
        return replies


def test_fedbuff_with_a_buffer_of_every_client_and_no_sites_is_fedavg_round_after_round():
    """Replies arriving at one simulated moment are all applied before a client is sent
    the model again: else the first to reply retrained the model of before the buffer its
    own reply completed (round 2 then held stale changes, applied twice)."""
    server = server_of(aggregation="fedbuff", sites=None, rounds=3)
    records = [server.mode.train(server, EqualAdding(), r) for r in (1, 2, 3)]
    assert [u["staleness"] for r in records for u in r["updates"]] == [0] * 9
    assert [u["version"] for r in records for u in r["updates"]] == [0] * 3 + [1] * 3 + [2] * 3
    step = sum(STEP.values()) / len(STEP)  # equal sizes: the replies arrive together
    assert server.ctx.global_state["w"].tolist() == pytest.approx([3 * step] * 2)


class Halving:
    """A transport whose client k answers a fit with half the model it got plus ``STEP[k]``
    (the order of updates matters)."""

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        return {
            cid: Message("fit", {"w": m.arrays["w"] / 2 + STEP[cid]}, {"num_examples": 1})
            for cid, m in messages.items()
        }


def test_fedasync_with_one_client_at_a_time_is_sequential_fedavg():
    server = server_of(
        aggregation="fedasync",
        sites=None,
        rounds=2,
        **{"async": {"concurrency": 1, "alpha": 1.0, "staleness": "constant"}},
    )
    records = [server.mode.train(server, Halving(), r) for r in (1, 2)]
    updates = [u for r in records for u in r["updates"]]
    assert [u["staleness"] for u in updates] == [0] * 6
    x = 0.0
    for u in updates:  # each client trains on the model the one before it made
        x = x / 2 + STEP[u["client"]]
    assert server.ctx.global_state["w"].tolist() == pytest.approx([x, x])


@pytest.mark.slow
def test_a_fedbuff_run_without_staleness_equals_the_fedavg_run():
    """Same clients, same seeds (a client's first fit of a round is seeded as a synchronous
    round's): the same losses and scores in every round (before: round 1's fits were seeded
    apart and later rounds held stale, twice-applied changes)."""
    sync = run(tiny(rounds=2, eval_test="every"))
    buffered = run(tiny(rounds=2, eval_test="every", aggregation="fedbuff"))
    assert sync.rounds[0]["train"] == buffered.rounds[0]["train"]  # the same fits, bit for bit
    for a, b in zip(sync.rounds, buffered.rounds):  # (x + (x_k - x)) rounds in the last bits
        for cid, losses in a["train"].items():
            assert b["train"][cid] == pytest.approx(losses, rel=1e-5)
        assert b["global"] == pytest.approx(a["global"], abs=1e-6)
    assert buffered.final["global"] == pytest.approx(sync.final["global"], abs=1e-6)


def test_staleness_weights():
    cfg, _ = resolve_config(tiny(aggregation="fedbuff"))
    assert staleness_weight(cfg, 0) == 1.0 and staleness_weight(cfg, 3) == pytest.approx(0.5)
    cfg, _ = resolve_config(tiny(aggregation="fedbuff", **{"async": {"staleness": "constant"}}))
    assert staleness_weight(cfg, 7) == 1.0


def timeless(records):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


TINY_SITES = {  # site2 ten times slower
    "base": {"samples_per_second": 100},
    "profiles": {"fast": {"compute": "1x"}, "slow": {"compute": "0.1x"}},
    "clients": {"site2": "slow", "*": "fast"},
}


@pytest.mark.slow
def test_an_asynchronous_run_resumes_exactly(tmp_path):
    """Interrupted after round 2 with updates in flight and in the buffer (site2's), then
    resumed: the records of an uninterrupted run."""
    config = tiny(rounds=3, aggregation="fedbuff", sites=TINY_SITES, checkpoint=True)
    config["async"] = {"buffer": 2}
    whole = run(config, out=tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(config, out=tmp_path / "cut", observer=InterruptAfter(2))
    resumed = resume(tmp_path / "cut")
    assert timeless(resumed.rounds) == timeless(whole.rounds)
    assert resumed.final["global"] == whole.final["global"]
    assert whole.final["simulated_seconds"] == whole.rounds[-1]["simulated_seconds"]
    times = [u["arrived"] for r in whole.rounds for u in r["updates"]]
    assert times == sorted(times)  # updates applied in order of their simulated arrival


@pytest.mark.slow
def test_fedbuff_finishes_its_rounds_sooner_than_sync_with_a_straggler():
    sync = run(tiny(rounds=3, sites=TINY_SITES))
    buffered = run(tiny(rounds=3, sites=TINY_SITES, aggregation="fedbuff"))
    assert buffered.final["simulated_seconds"] < sync.final["simulated_seconds"] / 2


class OwnAggregation:
    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        return None


class DeclaredAggregation(OwnAggregation):
    fedkit_asynchronous = True


class Asking:
    @hookimpl
    def fedkit_answer_query(self, client, query, arrays, scalars):
        return None


def test_plugins_whose_aggregation_needs_a_synchronous_round_are_refused_with_the_reason():
    with pytest.raises(FedkitError, match="fed-lwr.*every client of the round scores"):
        resolve_config(tiny(plugins=["fed-lwr"], aggregation="fedbuff"))
    with pytest.raises(FedkitError, match="was written for synchronous rounds"):
        resolve_config(tiny(aggregation="fedasync"), plugins={"mine": OwnAggregation()})
    resolve_config(tiny(aggregation="fedasync"), plugins={"mine": DeclaredAggregation()})
    with pytest.raises(FedkitError, match="asks the round's clients an extra question"):
        resolve_config(tiny(aggregation="fedbuff"), plugins={"asking": Asking()})
    resolve_config(tiny(plugins=["fedprox"], aggregation="fedbuff"))  # client-side only
    resolve_config(tiny(plugins=["fed-lwr"], aggregation="deadline", deadline=60))
    with pytest.raises(FedkitError, match="needs `deadline`"):
        resolve_config(tiny(aggregation="deadline"))
    with pytest.raises(FedkitError, match="is for aggregation=deadline"):
        resolve_config(tiny(deadline=3))


def test_a_runspec_part_naming_an_aggregation_mode_sets_it():
    assert runspec_layer("fedavg+fedbuff") == {"plugins": [], "aggregation": "fedbuff"}
    assert runspec_layer("fedprox+fedasync") == {"plugins": ["fedprox"], "aggregation": "fedasync"}
    assert runspec_layer("fedprox") == {"plugins": ["fedprox"]}
    with pytest.raises(FedkitError, match="two aggregation modes"):
        runspec_layer("fedbuff+fedasync")


@pytest.mark.parametrize(
    "key, good, bad, message",
    [  # moved from test_config.py with the options, now declared beside the round modes
        ("deadline", 1e-12, 0, "config key 'deadline' must be > 0, got 0"),
        ("async.alpha", 1, 0, "config key 'async.alpha' must be > 0, got 0"),
    ],
)
def test_the_round_keys_bounds_are_their_options(key, good, bad, message):
    assert resolve_layers([{key: good}], round_options())[key] == good
    with pytest.raises(FedkitError, match=message):
        resolve_layers([{key: bad}], round_options())
