"""FedLC's calibrated logits and loss against a hand computation; it refuses what it cannot
serve, and conflicts with another task loss."""

import math

import fedkit_baselines.cb as cb
import fedkit_baselines.fedlc as fedlc
import pytest
import torch

from fedkit_core import FedkitError, run
from fedkit_core.plugin import plugin_scope

from .lossfakes import SEGMENTATION, batch, client, server, small


def test_offsets_are_tau_times_the_count_to_the_minus_quarter():
    logits = torch.zeros(1, 3)
    out = fedlc.calibrated_logits(logits, torch.tensor([16.0, 1.0, 0.0]), tau=2.0)
    # 2 * 16^(-1/4) = 1, 2 * 1^(-1/4) = 2, an absent class drops out
    assert out[0, :2].tolist() == pytest.approx([-1.0, -2.0])
    assert out[0, 2] == -math.inf


def test_task_loss_is_cross_entropy_of_the_calibrated_logits():
    me = client([16, 1, 0], {"tau": 2.0})
    logits = torch.tensor([[1.0, 1.0, 5.0], [0.0, 3.0, 0.0]], requires_grad=True)
    with plugin_scope("fedlc"):
        loss = fedlc.fedkit_task_loss(me, batch([0, 1]), {"logits": logits})
    # calibrated rows [0, -1, -inf] and [-1, 1, -inf]; targets 0 and 1
    hand = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-2))) / 2
    assert loss.item() == pytest.approx(hand)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[:, 2] == 0).all()


def test_refuses_segmentation_and_another_loss_key():
    assert fedlc.fedkit_check(server()) is None
    assert fedlc.fedkit_check(server(SEGMENTATION, loss="dice")) == (
        "fedlc is a classification loss; 't' is segmentation"
    )
    assert "loss=bsm would be ignored" in fedlc.fedkit_check(server(loss="bsm"))


def test_two_task_losses_are_refused_clearly():
    with pytest.raises(FedkitError, match="both implement fedkit_task_loss"):
        run(small(), plugins={"fedlc": fedlc, "cb": cb})
