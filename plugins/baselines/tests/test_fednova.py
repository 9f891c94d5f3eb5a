"""FedNova: the step norm ``||a||_1`` against its sum, the server's normalised step by hand
(clients taking different numbers of steps), FedAvg when the step counts are equal, and the
counts each client reports."""

from __future__ import annotations

from types import SimpleNamespace

import fedkit_baselines.fednova as fednova
import pytest
import torch

from fedkit_core import run
from fedkit_core.plugin import Update, plugin_scope, weighted_average
from fedkit_core.testing import tiny


@pytest.mark.parametrize("steps", [1, 3, 10])
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_the_step_norm_is_the_sum_of_the_gradients_weights(steps, rho):
    # with momentum rho, gradient j (of `steps`) enters the update with sum_{k<steps-j} rho^k
    weights = [sum(rho**k for k in range(steps - j)) for j in range(steps)]
    assert fednova.step_norm(steps, "sgd", rho) == pytest.approx(sum(weights))
    assert fednova.step_norm(steps, "adam", rho) == steps


def aggregate(glob, updates):
    server = SimpleNamespace(global_state=glob, state={"params": ["w"]})
    with plugin_scope("fednova"):
        return fednova.fedkit_aggregate(server=server, updates=updates, ask=None)


def update(cid, w, n, steps):
    return Update(cid, {"w": torch.tensor(w)}, {"num_examples": n, fednova.NORM: float(steps)})


def test_different_step_counts_are_normalised():
    # x = 0; client a: 2 steps to 1.0, 10 examples; client b: 6 steps to 1.5, 30 examples
    new = aggregate(
        {"w": torch.tensor([0.0])}, [update("a", [1.0], 10, 2), update("b", [1.5], 30, 6)]
    )
    tau_eff = 0.25 * 2 + 0.75 * 6  # 5.0
    direction = 0.25 * (0 - 1.0) / 2 + 0.75 * (0 - 1.5) / 6  # the mean move per step
    assert new["w"].item() == pytest.approx(-tau_eff * direction)  # 1.5625
    assert new["w"].item() != pytest.approx(0.25 * 1.0 + 0.75 * 1.5)  # FedAvg: 1.375


def test_fedavg_weights_the_client_with_more_steps_more():
    # a: 1 step of size 1 (to 1.0); b: 4 steps of size 1 (to 4.0); equal sizes
    new = aggregate(
        {"w": torch.tensor([0.0])}, [update("a", [1.0], 10, 1), update("b", [4.0], 10, 4)]
    )
    # FedAvg: 2.5; FedNova: tau_eff 2.5 times the mean per-step move 1.0
    assert new["w"].item() == pytest.approx(2.5)
    new = aggregate(
        {"w": torch.tensor([0.0])}, [update("a", [1.0], 10, 1), update("b", [2.0], 10, 4)]
    )
    # per-step moves 1.0 and 0.5 -> mean 0.75, tau_eff 2.5: 1.875 (FedAvg: 1.5)
    assert new["w"].item() == pytest.approx(1.875)


def test_equal_step_counts_are_fedavg():
    glob = {"w": torch.tensor([0.5, -1.0]), "n": torch.tensor(0)}
    states = [
        {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)},
        {"w": torch.tensor([4.0, 0.0]), "n": torch.tensor(5)},
    ]
    updates = [
        Update(c, s, {"num_examples": n, fednova.NORM: 3.0})
        for c, s, n in zip("ab", states, (10, 30))
    ]
    new = aggregate(glob, updates)
    mean = weighted_average(states, [10, 30])
    assert torch.allclose(new["w"], mean["w"]) and new["n"] == mean["n"]


def test_clients_report_their_steps():
    results = run(tiny(rounds=1, plugins=["fednova"], batch_size=8, task={"head_samples": 40}))
    steps = {cid: t[fednova.STEPS] for cid, t in results.rounds[0]["train"].items()}
    assert all(s > 0 for s in steps.values())
    for t in results.rounds[0]["train"].values():
        assert t[fednova.NORM] == t[fednova.STEPS]  # Adam: each step counted once
