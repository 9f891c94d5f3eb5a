"""The client helpers for plugins' own phases: ``client.train`` (a local phase on chosen
parameters), ``client.score`` (metrics of a model output on the client's own split),
``client.lr`` and ``client.round`` at evaluation, and eval-only model extras."""

from __future__ import annotations

import torch
from torch import nn

from fedkit_core import hookimpl, run
from fedkit_core.plugin import FedModel
from fedkit_core.testing import tiny, tiny_seg


class Phase:
    """Trains the head alone for one epoch before local training; scores the model on the
    validation split; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    @hookimpl
    def fedkit_round_start(self, client):
        model = client.model
        body = {k: v.clone() for k, v in model.backbone.state_dict().items()}
        head = model.head.weight.detach().clone()
        before = client.score("val")
        model.eval()  # the body's batch-norm statistics stay as received
        loss = client.train(
            list(model.head.parameters()), 1, forward=lambda x: model.head(model.backbone(x))
        )
        self.seen.append(
            {
                "lr": client.lr,
                "loss": loss,
                "head_moved": not torch.equal(head, model.head.weight),
                "body_kept": all(
                    torch.equal(body[k], v) for k, v in model.backbone.state_dict().items()
                ),
                "score": before,
                "training": model.training,
            }
        )

    @hookimpl
    def fedkit_eval_views(self, client):
        self.seen.append({"eval_round": client.round})


def test_train_moves_only_the_given_parameters_at_the_rounds_rate():
    phase = Phase()
    config = tiny(rounds=2, lr=0.02, lr_schedule="exp", lr_gamma=0.5, eval_test="every")
    run(config, plugins={"phase": phase})  # every: one evaluate message per client and round
    fits = [s for s in phase.seen if "lr" in s]
    assert {round(s["lr"], 6) for s in fits} == {0.02, 0.01}
    assert all(s["head_moved"] and s["body_kept"] and s["loss"] > 0 for s in fits)
    assert all(0 <= s["score"]["bacc"] <= 1 and "acc" in s["score"] for s in fits)
    assert [s["eval_round"] for s in phase.seen if "eval_round" in s] == [1] * 3 + [2] * 3


def test_train_with_a_seed_is_reproducible_and_leaves_the_round_streams_alone():
    class Seeded(Phase):
        @hookimpl
        def fedkit_round_start(self, client):
            head = client.model.head
            start = {k: v.clone() for k, v in head.state_dict().items()}
            rng = client.rng.get_state()
            a = client.train(list(head.parameters()), 1, seed=7)
            head.load_state_dict(start)
            b = client.train(list(head.parameters()), 1, seed=7)
            self.seen.append({"same": a == b, "rng_kept": torch.equal(rng, client.rng.get_state())})

    seeded = Seeded()
    run(tiny(rounds=1), plugins={"seeded": seeded})
    assert seeded.seen and all(s["same"] and s["rng_kept"] for s in seeded.seen if "same" in s)


def test_score_on_segmentation_gives_dice():
    phase = Phase()

    class Score:
        @hookimpl
        def fedkit_round_start(self, client):
            phase.seen.append(client.score("val"))

    run(tiny_seg(rounds=1), plugins={"score": Score()})
    assert any("dice" in s for s in phase.seen)


def test_eval_only_extras_run_only_in_eval_mode():
    model = FedModel(nn.Linear(3, 4), nn.Linear(4, 2), 4)
    model.add_extra("tuned", nn.Linear(3, 2), input="image", eval_only=True)
    x = torch.randn(2, 3)
    assert "tuned" not in model.train()(x)
    assert model.eval()(x)["tuned"].shape == (2, 2)
