"""FedBABU: one frozen head on every party, never trained or sent; fine-tuned for evaluation."""

import pytest
from fedkit_baselines import fedbabu

from fedkit_core import FedkitError, hookimpl, run
from fedkit_core.testing import tiny, tiny_seg

from .baseline_probes import Uploads, Watch, same, snapshot


class Tuned:
    """Records, after FedBABU's fine-tuning, the tuned copy and the received global model."""

    def __init__(self):
        self.pairs = []

    @hookimpl
    def fedkit_eval_views(self, client):
        tuned = client.model.extras[fedbabu.TUNED]
        self.pairs.append((snapshot(tuned.backbone), snapshot(client.model.backbone)))


def test_head_unchanged_during_training_and_the_same_everywhere():
    uploads, watch, tuned = Uploads(), Watch("head"), Tuned()
    results = run(
        tiny(rounds=2, fedbabu={"finetune_epochs": 1}),
        plugins={"fedbabu": fedbabu, "uploads": uploads, "watch": watch, "tuned": tuned},
    )
    heads = list(watch.start.values()) + list(watch.end.values())
    assert all(same(heads[0], head) for head in heads)  # every client, every round
    for rnd in uploads.updates:
        for arrays in rnd.values():
            assert arrays and not any(key.startswith("head.") for key in arrays)
    # evaluation fine-tuned a copy of the global model; the global model itself is unchanged
    assert tuned.pairs and all(not same(copy, glob) for copy, glob in tuned.pairs)
    assert set(results.final["views"]) == {"global", "personal"}


def test_the_head_comes_from_the_seed():
    a = run(tiny(rounds=1, seed=1, fedbabu={"finetune_epochs": 0}), plugins={"fedbabu": fedbabu})
    b = run(tiny(rounds=1, seed=1, fedbabu={"finetune_epochs": 0}), plugins={"fedbabu": fedbabu})
    assert a.final["global"] == pytest.approx(b.final["global"])
    # no fine-tuning: the personal view is the global model
    views = a.final["views"]
    assert views["personal"]["global"]["bacc"] == pytest.approx(views["global"]["global"]["bacc"])


def test_segmentation_is_refused():
    with pytest.raises(FedkitError, match="fedbabu freezes a classification head"):
        run(tiny_seg(rounds=1), plugins={"fedbabu": fedbabu})
