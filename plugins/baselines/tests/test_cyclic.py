"""Cyclic weight transfer: one client a round, every client once per cycle, the same turns on
resume, the trained client's model becoming the global one, and sample_fraction refused."""

from __future__ import annotations

import fedkit_baselines.cyclic as cyclic
import pytest
import torch

from fedkit_core import FedkitError, run
from fedkit_core.plugin import hookimpl
from fedkit_core.testing import tiny

CLIENTS = ["site0", "site1", "site2", "site3"]


@pytest.mark.parametrize("order", ["fixed", "shuffled"])
def test_every_client_takes_one_turn_per_cycle(order):
    turns = [cyclic.turn(CLIENTS, r, seed=3, order=order) for r in range(1, 13)]
    for cycle in range(3):
        assert sorted(turns[4 * cycle : 4 * cycle + 4]) == CLIENTS
    assert turns == [cyclic.turn(CLIENTS, r, seed=3, order=order) for r in range(1, 13)]
    if order == "fixed":
        assert turns[:4] == CLIENTS
    else:
        cycles = {tuple(turns[i : i + 4]) for i in range(0, 12, 4)}
        assert len(cycles) > 1, "a new order each cycle"


class Trained:
    """Keeps each round's trained model of the client whose turn it was."""

    def __init__(self) -> None:
        self.models: dict[int, dict[str, torch.Tensor]] = {}
        self.received: dict[int, dict[str, torch.Tensor]] = {}

    @hookimpl
    def fedkit_round_start(self, client):
        self.received[client.round] = client.model.shared_state()

    @hookimpl
    def fedkit_client_report(self, client):
        self.models[client.round] = client.model.shared_state()


def test_the_model_goes_from_client_to_client():
    trained = Trained()
    results = run(
        tiny(rounds=4, plugins=["cyclic"], cyclic={"order": "fixed"}), plugins={"t": trained}
    )
    assert [r["sampled"] for r in results.rounds] == [["site0"], ["site1"], ["site2"], ["site0"]]
    for rnd in (2, 3, 4):  # each turn starts from the previous turn's trained model
        previous, start = trained.models[rnd - 1], trained.received[rnd]
        assert all(torch.equal(previous[k], start[k]) for k in start)


def test_sample_fraction_is_refused():
    with pytest.raises(FedkitError, match="sample_fraction"):
        run(tiny(plugins=["cyclic"], sample_fraction=0.5))
