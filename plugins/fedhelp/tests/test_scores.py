"""The contribution scores a_m: their own optimiser group, and learning which API to trust
when the APIs disagree."""

import fedkit_fedhelp.plugin as fh
import numpy as np
import pytest
import torch
from fedkit_priors import Knowledge, save_knowledge

from fedkit_core import run
from fedkit_core.plugin import hookimpl
from fedkit_core.testing import ClientRuntime, tiny


@pytest.fixture
def disagreeing(tmp_path):
    """8 public images whose brightness gives their label (4 classes); API "right" puts 0.85
    on the label, API "wrong" 0.85 on the next class."""
    rng = np.random.default_rng(0)
    labels = np.arange(8) % 4
    base = 20 + 60 * labels[:, None, None, None]
    images = (base + rng.integers(0, 10, (8, 20, 20, 3))).astype(np.uint8)
    right, wrong = np.full((8, 4), 0.05), np.full((8, 4), 0.05)
    right[np.arange(8), labels] = 0.85
    wrong[np.arange(8), (labels + 1) % 4] = 0.85
    probs = np.stack([right, wrong], axis=1).astype(np.float32)
    path = tmp_path / "disagreeing.npz"
    save_knowledge(Knowledge(images, probs, labels, ["right", "wrong"], list("abcd")), path)
    return path


class LastScores:
    """Each client's contribution scores a = softmax(logits) after its last round."""

    def __init__(self):
        self.a = {}

    @hookimpl
    def fedkit_client_report(self, client):
        logits = client.model.extras[fh.SCORES].logits.detach()
        self.a[client.id] = torch.softmax(logits, dim=1)


def small_clients(knowledge, **overrides):
    options = {"knowledge": str(knowledge), "large_min_size": 10**6, **overrides}
    return tiny(plugins=["fedhelp"], model="cnn", task={"sites": 2}, fedhelp=options)


def learns_the_right_api(a: torch.Tensor, rows: float = 0.9) -> bool:
    """API "right" weighs more on a share ``rows`` of the public samples and 0.6 on average."""
    return bool((a[:, 0] > 0.5).float().mean() >= rows and a[:, 0].mean() > 0.6)


def test_scores_move_towards_the_api_that_agrees_with_the_public_labels(disagreeing):
    learned, frozen = LastScores(), LastScores()
    sgd = {"optimizer": "sgd", "lr": 0.05}
    run({**small_clients(disagreeing), **sgd}, plugins={"spy": learned})
    run({**small_clients(disagreeing, score_lr=0.05), **sgd}, plugins={"spy": frozen})
    assert len(learned.a) == 2
    for cid, a in learned.a.items():
        assert learns_the_right_api(a)  # "right" wins on (nearly) every public sample
        # at the network's rate (the old plugin's) they stay near uniform
        assert (frozen.a[cid][:, 0] - 0.5).abs().max() < 0.05


def test_with_adam_the_default_score_rate_learns_too(disagreeing):
    learned = LastScores()
    run({**small_clients(disagreeing), "optimizer": "adam", "lr": 1e-3}, plugins={"spy": learned})
    assert all(learns_the_right_api(a, rows=0.75) for a in learned.a.values())


def test_scores_have_their_own_group_with_score_lr_following_the_schedule(disagreeing, monkeypatch):
    seen = []
    build = ClientRuntime._optimizer

    def recording(self, lr):
        optimizer = build(self, lr)
        scores = self.ctx.model.extras[fh.SCORES].logits
        groups = [g for g in optimizer.param_groups if any(p is scores for p in g["params"])]
        seen.append((lr, groups))
        return optimizer

    monkeypatch.setattr(ClientRuntime, "_optimizer", recording)
    cfg = small_clients(disagreeing, score_lr=40.0)
    schedule = {"optimizer": "sgd", "lr": 0.05, "lr_schedule": "exp", "lr_gamma": 0.5}
    run({**cfg, **schedule, "rounds": 2, "weight_decay": 1e-3})
    assert len(seen) == 2 * 2
    for lr, groups in seen:
        assert len(groups) == 1 and len(groups[0]["params"]) == 1  # the scores alone
        assert groups[0]["lr"] == pytest.approx(40.0 * lr / 0.05)  # 40, then 20
        assert groups[0]["weight_decay"] == 0.0
    assert {round(lr, 6) for lr, _ in seen} == {0.05, 0.025}


def test_scores_statistics_from_a_runs_client_checkpoints(disagreeing, tmp_path):
    from fedkit_fedhelp.scores import client_scores, statistics

    cfg = {**small_clients(disagreeing), "optimizer": "sgd", "lr": 0.05, "checkpoint": True}
    run({**cfg, "rounds": 1}, out=tmp_path / "run")
    scores = client_scores(tmp_path / "run")
    assert set(scores) == {"site0", "site1"} and scores["site0"].shape == (8, 2)
    stats = statistics(scores["site0"])
    assert sum(stats["mean_a"]) == pytest.approx(1.0, abs=1e-3)
    assert stats["moved"] > 0 and stats["max_abs_logit"] > 0
    flat = statistics(torch.zeros(3, 2))
    assert flat == {"mean_a": [0.5, 0.5], "moved": 0.0, "mean_max_a": 0.5, "max_abs_logit": 0.0}
