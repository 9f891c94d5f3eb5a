"""The membership-inference check (fedkit_core.tools.attack): the loss-threshold attack's
AUC, and the attack run against a finished run's global model."""

import numpy as np
import pytest

from fedkit_core import run
from fedkit_core.errors import FedkitError
from fedkit_core.testing import tiny
from fedkit_core.tools.attack import attack_auc, membership_auc


def test_the_attack_scores_lower_losses_as_members():
    rng = np.random.default_rng(0)
    members, others = rng.exponential(0.1, 400), rng.exponential(1.0, 300)
    assert attack_auc(members, others) > 0.85  # members fit well: the attack sees them
    assert attack_auc(others, members) < 0.15
    same = attack_auc(rng.exponential(1.0, 400), rng.exponential(1.0, 400))
    assert abs(same - 0.5) < 0.08  # one distribution: chance


def test_the_attack_needs_both_sets():
    with pytest.raises(FedkitError, match="members and non-members"):
        attack_auc(np.zeros(0), np.ones(5))


@pytest.mark.slow
def test_membership_of_a_finished_run(tmp_path):
    # a run that memorises its few training samples: many local epochs, no augmentation
    run(tiny(rounds=3, local_epochs=8, checkpoint=True), out=tmp_path / "run")
    attack = membership_auc(tmp_path / "run")
    assert attack["members"] > 0 and attack["non_members"] > 0
    assert attack["member_loss"] < attack["non_member_loss"]
    assert attack["auc"] > 0.5


def test_a_run_without_checkpoint_is_refused(tmp_path):
    run(tiny(rounds=1), out=tmp_path / "run")
    with pytest.raises(FedkitError, match="no checkpoint"):
        membership_auc(tmp_path / "run")
