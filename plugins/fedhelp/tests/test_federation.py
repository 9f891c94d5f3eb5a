"""FedHelp end to end on a tiny synthetic federation: what is uploaded, what stays, what is
served, on the local and the Flower engine."""

import fedkit_fedhelp.plugin as fh
import pytest
import torch

from fedkit_core import FedkitError, hookimpl, run
from fedkit_core.testing import tiny


class Spy:
    """Records every upload the server receives (and falls back to FedAvg)."""

    def __init__(self):
        self.uploads = []
        self.start, self.end = {}, {}  # (round, client) -> private state

    @hookimpl
    def fedkit_round_start(self, client):
        self.start[client.round, client.id] = client.model.private_state()

    @hookimpl
    def fedkit_client_report(self, client):
        self.end[client.round, client.id] = client.model.private_state()

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        self.uploads += [dict(u.arrays) for u in updates]


def config(knowledge, **overrides):
    return tiny(
        plugins=["fedhelp"],
        model="resnet20",
        fedhelp={
            "knowledge": str(knowledge),
            "large_clients": ["site0"],
            "large_model": "resnet32",
        },
        **overrides,
    )


def test_only_the_small_backbone_is_uploaded_and_clients_serve_their_own_models(knowledge_file):
    spy = Spy()
    results = run(config(knowledge_file), plugins={"spy": spy})
    assert len(spy.uploads) == 2 * 3
    for upload in spy.uploads:
        assert upload and all(k.startswith("backbone.") for k in upload)
        params = sum(
            v.numel() for k, v in upload.items() if "running" not in k and "num_b" not in k
        )
        assert params < 0.3e6  # ResNet-20's feature extractor, not the ResNet-32
    final = results.final
    assert final["global"] == {}
    assert set(final["clients"]) == {"site0", "site1", "site2"}
    served = final["views"]["served"]["clients"]
    small = final["views"]["small"]["clients"]
    assert served["site1"] == small["site1"]  # a small client serves its small model
    assert final["clients"]["site0"] == served["site0"]
    train = results.rounds[-1]["train"]
    assert "loss.fedhelp.kd_b" in train["site0"] and "loss.fedhelp.public" not in train["site0"]
    assert "loss.fedhelp.public" in train["site1"] and "loss.fedhelp.kd_b" not in train["site1"]
    # private parts: the large model on the large client only, scores learned, all kept
    small, large = spy.end[1, "site1"], spy.end[1, "site0"]
    assert any(k.startswith(f"extras.{fh.LARGE}.") for k in large)
    assert not any(k.startswith(f"extras.{fh.SURROGATE}.") for k in large)
    scores = small[f"extras.{fh.SCORES}.logits"]
    assert scores.shape == (12, 2) and scores.abs().sum() > 0  # learned from zeros
    for cid in ("site0", "site1"):
        before = spy.start[2, cid]
        assert all(torch.equal(before[k], v) for k, v in spy.end[1, cid].items())


def test_flower_engine_runs_different_architectures_per_node(knowledge_file):
    cfg = config(knowledge_file, engine="flower", flower={"backend": "thread"}, rounds=1)
    results = run(cfg)
    assert set(results.final["clients"]) == {"site0", "site1", "site2"}


def test_roles_from_own_size_and_bad_settings(knowledge_file):
    cfg = config(knowledge_file)
    cfg["fedhelp"] = {"knowledge": str(knowledge_file), "large_min_size": 10**6}
    results = run({**cfg, "rounds": 1})
    assert all("loss.fedhelp.public" in t for t in results.rounds[0]["train"].values())
    with pytest.raises(FedkitError, match="exactly one"):
        run({**cfg, "fedhelp": {"knowledge": str(knowledge_file)}})
    with pytest.raises(FedkitError, match="unknown clients"):
        run({**cfg, "fedhelp": {"knowledge": str(knowledge_file), "large_clients": ["nope"]}})
