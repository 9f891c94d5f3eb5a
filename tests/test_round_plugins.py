"""A third party adds a selection rule and a round mode in one file, through
``fedkit_core.plugin`` alone (the plugin below is that file), and a run chooses them by
config key; unknown names list the known ones."""

from __future__ import annotations

import types

import pytest

from fedkit_core import run
from fedkit_core.errors import FedkitError
from fedkit_core.plugin import RoundMode, hookimpl
from fedkit_core.resolve import resolve_config
from fedkit_core.testing import tiny

# --------------------------------------------------------------- the one-file plugin


def first_two(server, clients):
    """Selection rule: the first two clients, every round."""
    return list(clients)[:2]


class OneByOne(RoundMode):
    """Round mode: the selected clients train one after another, each on the model the
    one before it made (cyclic weight transfer)."""

    def train(self, federation, transport, rnd):
        strategy, exchange = federation.strategy, federation.exchange
        sampled = strategy.select(federation.client_ids, rnd)
        trained = {}
        for cid in sampled:
            replies = federation.fit(transport, federation.fit_messages([cid], rnd), rnd)
            ok = exchange.failures("fit", rnd, replies, required=1)
            updates = strategy.updates(replies, ok, rnd)
            ask = federation.asker(transport, rnd, ok)
            federation.ctx.global_state = strategy.aggregate(updates, ask, rnd)
            trained[cid] = strategy.reported(replies[cid].scalars)
        return {"round": rnd, "global": {}, "clients": {}, "sampled": sampled, "train": trained}


@hookimpl
def fedkit_register_selection_rules(register):
    register("first-two", first_two)


@hookimpl
def fedkit_register_round_modes(register):
    register("one-by-one", OneByOne)


PLUGIN = types.SimpleNamespace(
    fedkit_register_selection_rules=fedkit_register_selection_rules,
    fedkit_register_round_modes=fedkit_register_round_modes,
)

# --------------------------------------------------------------- the tests


def test_a_plugins_selection_rule_chooses_who_trains():
    results = run(tiny(selection="first-two"), plugins={"mine": PLUGIN})
    assert [r["sampled"] for r in results.rounds] == [["site0", "site1"]] * 2
    assert all(list(r["train"]) == ["site0", "site1"] for r in results.rounds)


@pytest.mark.slow
def test_a_plugins_round_mode_runs_the_rounds():
    """One fit exchange per client: the traffic of a round's fits is that of 3 messages
    sent one by one, and the model after a round differs from FedAvg's."""
    mine = run(tiny(aggregation="one-by-one"), plugins={"mine": PLUGIN})
    plain = run(tiny(), plugins={"mine": PLUGIN})
    assert [list(r["train"]) for r in mine.rounds] == [["site0", "site1", "site2"]] * 2
    assert [r["sampled"] for r in mine.rounds] == [r["sampled"] for r in plain.rounds]
    losses = [r["train"][c]["loss"] for r in mine.rounds for c in r["train"]]
    plain_losses = [r["train"][c]["loss"] for r in plain.rounds for c in r["train"]]
    assert losses[0] == plain_losses[0]  # the first client trains on the same model
    assert losses[1] != plain_losses[1]  # the second on the first one's


def test_unknown_rule_or_mode_names_the_known_ones():
    with pytest.raises(FedkitError, match=r"unknown selection rule 'last'.*first-two, sample"):
        resolve_config(tiny(selection="last"), plugins={"mine": PLUGIN})
    with pytest.raises(FedkitError, match=r"unknown round mode 'fedx'.*one-by-one, sync"):
        resolve_config(tiny(aggregation="fedx"), plugins={"mine": PLUGIN})
