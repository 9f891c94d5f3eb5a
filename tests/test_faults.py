"""Faults (issue 18): a tolerated client failing mid-round keeps no half-trained state (the
local engine then agrees with Flower, whose node context keeps its last state), and every
client failing is a clear error even when ``min_clients=0`` tolerates any number."""

import pytest

from fedkit_core import FedkitError, hookimpl, run
from fedkit_core.errors import ClientFailure
from fedkit_core.testing import tiny


class MidRound:
    """site1 fails after its first training batch of round 1; every client counts its fits
    in its plugin state and keeps a private running sum of its head weights."""

    @hookimpl
    def fedkit_round_start(self, client):
        client.state["fits"] = client.state.get("fits", 0) + 1
        client.state["batches"] = 0

    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        client.state["batches"] += 1
        if client.id == "site1" and client.round == 1 and client.state["batches"] == 2:
            raise FedkitError("site1 lost its connection")
        return {}

    @hookimpl
    def fedkit_client_report(self, client):
        return {"mid.fits": client.state["fits"]}


def test_a_client_failing_mid_round_keeps_no_half_trained_state():
    config = tiny(rounds=2, min_clients=1, keep_optimizer_state=True)
    local = run(config, plugins={"mid": MidRound()})
    assert [e["client"] for e in local["events"]] == ["site1"]
    # round 1 never happened for site1: its state is the one before it, as on Flower
    assert local.rounds[1]["train"]["site1"]["mid.fits"] == 1
    assert local.rounds[1]["train"]["site0"]["mid.fits"] == 2
    pytest.importorskip("flwr")
    flower = {**config, "engine": "flower", "flower": {"backend": "thread"}}
    other = run(flower, plugins={"mid": MidRound()})
    assert other["events"] == local["events"]
    assert other.rounds[1]["train"] == local.rounds[1]["train"]
    for scope in ("global", "clients"):
        assert _close(other.final[scope], local.final[scope]), scope


def _close(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return abs(a - b) < 1e-6
    return a == b


class AllFail:
    def __init__(self, error):
        self.error = error

    @hookimpl
    def fedkit_round_start(self, client):
        raise self.error


@pytest.mark.parametrize(
    "error, kind, code",
    [(FedkitError("no data today"), FedkitError, 2), (ZeroDivisionError("x"), ClientFailure, 1)],
)
def test_every_client_failing_is_a_clear_error_even_with_min_clients_0(error, kind, code):
    with pytest.raises(kind, match="no data today|ZeroDivisionError") as err:
        run(tiny(rounds=1, min_clients=0), plugins={"fail": AllFail(error)})
    assert err.value.exit_code == code
