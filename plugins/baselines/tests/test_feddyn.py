"""FedDyn: the server's ``h`` and model by hand (partial participation), and each client's
gradient state ``g_k = -alpha (y_k - x)`` after its first round."""

from __future__ import annotations

from types import SimpleNamespace

import fedkit_baselines.feddyn as feddyn
import pytest
import torch

from fedkit_core import run
from fedkit_core.plugin import Update, hookimpl, plugin_scope
from fedkit_core.testing import tiny


def test_the_server_step_by_hand():
    glob = {"w": torch.tensor([1.0]), "bn.running_mean": torch.tensor([0.0])}
    server = SimpleNamespace(
        options=lambda: {"alpha": 0.5},
        state={"params": ["w"], "h": {"w": torch.tensor([0.2])}},
        global_state=glob,
        task=SimpleNamespace(client_ids=["a", "b", "c", "d"]),  # m = 4, two take part
    )
    updates = [
        Update(
            "a",
            {"w": torch.tensor([3.0]), "bn.running_mean": torch.tensor([1.0])},
            {"num_examples": 1},
        ),
        Update(
            "b",
            {"w": torch.tensor([2.0]), "bn.running_mean": torch.tensor([3.0])},
            {"num_examples": 99},
        ),
    ]
    with plugin_scope("feddyn"):
        new = feddyn.fedkit_aggregate(server=server, updates=updates, ask=None)
    h = 0.2 - 0.5 / 4 * ((3.0 - 1.0) + (2.0 - 1.0))  # -0.175
    assert server.state["h"]["w"].item() == pytest.approx(h)
    assert new["w"].item() == pytest.approx(2.5 - h / 0.5)  # uniform mean, not by examples
    assert new["bn.running_mean"].item() == pytest.approx(2.0)


class Moves:
    """Records each client's received and trained parameters in round 1 (runs after feddyn)."""

    def __init__(self) -> None:
        self.checked = 0

    @hookimpl
    def fedkit_round_start(self, client):
        client.scratch["x"] = {n: p.detach().clone() for n, p in client.model.named_parameters()}

    @hookimpl
    def fedkit_client_report(self, client):
        if client.round != 1:
            return
        grad = client.states["feddyn"]["grad"]
        params = dict(client.model.named_parameters())
        for n, g in grad.items():
            expected = -0.1 * (params[n].detach() - client.scratch["x"][n])
            assert torch.allclose(g, expected, atol=1e-7)
            self.checked += 1


def test_each_client_tracks_its_gradient():
    moves = Moves()
    results = run(
        tiny(rounds=2, plugins=["feddyn"], feddyn={"alpha": 0.1}), plugins={"moves": moves}
    )
    assert moves.checked > 10
    second = results.rounds[1]["train"]
    assert all(t["loss.feddyn.linear"] != 0.0 for t in second.values())  # g_k is in use
