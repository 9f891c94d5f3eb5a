"""MOON's contrastive term against a hand computation; the previous local model is the one
the client trained in its last round, kept on the client and never uploaded."""

import math

import fedkit_baselines.cb as cb
import fedkit_baselines.moon as moon
import pytest
import torch
from torch import nn

from fedkit_core import hookimpl, run
from fedkit_core.plugin import FedModel

from .lossfakes import small


def test_contrastive_term_matches_hand_computation():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_prev = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    # sims (global, previous): (1, 0) and (1/sqrt 2, 1); T = 0.5
    hand = [
        -math.log(math.exp(2) / (math.exp(2) + 1)),
        -math.log(math.exp(2**0.5) / (math.exp(2**0.5) + math.exp(2))),
    ]
    assert moon.contrastive(z, z_glob, z_prev, 0.5).item() == pytest.approx(sum(hand) / 2)


def test_projection_uses_the_given_weights_and_leaves_the_model_alone():
    torch.manual_seed(0)

    def model():
        m = FedModel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), nn.Linear(4, 2), 4)
        m.head = moon.ProjectedClassifier(4, 5, 2)
        return m

    mine, other = model(), model()
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    x = torch.randn(6, 3)
    z = moon.project(mine, moon.encoder_state(other), x)
    other.eval()
    assert torch.allclose(z, other.head.projection(other.backbone(x)), atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in mine.state_dict().items())
    assert mine.training and not z.requires_grad


class Spy:
    """Records each client's encoder after training, MOON's previous model at the next
    round's start, and what is uploaded."""

    def __init__(self):
        self.trained, self.previous, self.uploads = {}, {}, {}

    @hookimpl
    def fedkit_round_start(self, client):
        kept = client.states.get("moon", {}).get("previous")
        self.previous[client.round, client.id] = kept

    @hookimpl
    def fedkit_client_report(self, client):
        self.trained[client.round, client.id] = moon.encoder_state(client.model)

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        self.uploads[server.round] = {u.client_id: set(u.arrays) for u in updates}
        return None


def test_previous_model_is_last_rounds_local_model_and_stays_on_the_client():
    spy = Spy()
    results = run(small(rounds=2), plugins={"moon": moon, "cb": cb, "spy": spy})
    train = next(iter(results.rounds[1]["train"].values()))
    assert train["loss.moon.contrastive"] > 0
    for (rnd, cid), kept in spy.previous.items():
        if rnd == 1:
            assert kept is None  # first round: the global model stands in
            continue
        trained = spy.trained[1, cid]
        for part in trained:
            assert all(torch.equal(kept[part][k], trained[part][k].cpu()) for k in trained[part])
    for uploads in spy.uploads.values():
        for keys in uploads.values():
            assert any(k.startswith("head.projection.") for k in keys)
            assert not any("previous" in k for k in keys)
