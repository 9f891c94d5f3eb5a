"""FedProx's term against a hand computation, and its pull towards the global model."""

from types import SimpleNamespace

import fedkit_fedprox
import pytest
import torch
from torch import nn

from fedkit_core import hookimpl, run
from fedkit_core.testing import tiny


def test_proximal_term_matches_hand_computation():
    model = nn.Linear(3, 2)
    state: dict = {}
    client = SimpleNamespace(
        model=model,
        options=lambda name: {"mu": 0.4},
        plugin_state=lambda name: state.setdefault(name, {}),
    )
    fedkit_fedprox.fedkit_round_start(client)
    with torch.no_grad():
        model.weight += 0.5
    term = fedkit_fedprox.fedkit_loss_terms(client, None, None)["fedprox.proximal"]
    assert term.item() == pytest.approx(0.5 * 0.4 * (0.5**2) * 6)


class Drift:
    """Reports how far the local model moved from the received global model."""

    @hookimpl
    def fedkit_round_start(self, client):
        client.plugin_state("drift")["w"] = [p.detach().clone() for p in client.model.parameters()]

    @hookimpl
    def fedkit_client_report(self, client):
        start = client.plugin_state("drift").pop("w")
        return {
            "drift": sum(float((p - s).norm()) for p, s in zip(client.model.parameters(), start))
        }


def mean_drift(results):
    values = [c["drift"] for r in results.rounds for c in r["train"].values()]
    return sum(values) / len(values)


def test_a_large_mu_keeps_local_models_near_the_global_one():
    free = run(tiny(optimizer="sgd", lr=0.05), plugins={"drift": Drift()})
    held = run(
        tiny(optimizer="sgd", lr=0.05, plugins=["fedprox"], fedprox={"mu": 5.0}),
        plugins={"drift": Drift()},
    )
    assert held["plugins"]["fedprox"] == "0.1.0"
    assert mean_drift(held) < 0.8 * mean_drift(free)
