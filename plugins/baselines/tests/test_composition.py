"""The part-B baselines compose where the methods allow it and refuse clearly where not."""

import pytest
from fedkit_baselines import ditto, fedce, fedrep, solo

from fedkit_core import FedkitError, run
from fedkit_core.testing import tiny


def test_two_personalisations_are_a_reported_conflict():
    with pytest.raises(FedkitError, match="fedkit_client_view"):
        run(tiny(rounds=1), plugins={"ditto": ditto, "fedrep": fedrep})


def test_fedce_weights_the_bodies_of_fedrep():
    results = run(
        tiny(rounds=2, fedrep={"head_epochs": 1}), plugins={"fedrep": fedrep, "fedce": fedce}
    )
    assert results.final["clients"] and results.final["global"] == {}
    assert all("fedce.minus_score" in c for r in results.rounds for c in r["train"].values())


def test_fedce_has_nothing_to_weigh_under_solo():
    with pytest.raises(FedkitError, match="fedce needs shared trainable parameters"):
        run(tiny(rounds=1), plugins={"solo": solo, "fedce": fedce})
