"""FedHelp end to end on a tiny synthetic federation: what is uploaded, what stays, what is
served, on the local and the Flower engine."""

import fedkit_fedhelp.plugin as fh
import pytest
import torch

from fedkit_core import FedkitError, hookimpl, run
from fedkit_core.testing import ClientRuntime, tiny


@pytest.fixture
def messages(monkeypatch):
    """Every (client id, message received, reply sent) of the in-process engine."""
    seen = []
    handle = ClientRuntime.handle

    def recording(self, message):
        reply = handle(self, message)
        seen.append((self.id, message, reply))
        return reply

    monkeypatch.setattr(ClientRuntime, "handle", recording)
    return seen


class Spy:
    """Records each client's private state at the start and end of its rounds."""

    def __init__(self):
        self.start, self.end = {}, {}  # (round, client) -> private state

    @hookimpl
    def fedkit_round_start(self, client):
        self.start[client.round, client.id] = client.model.private_state()

    @hookimpl
    def fedkit_client_report(self, client):
        self.end[client.round, client.id] = client.model.private_state()


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


@pytest.mark.slow
def test_the_whole_small_model_is_averaged_and_private_parts_never_leave_a_client(
    knowledge_file, messages
):
    spy = Spy()
    results = run(config(knowledge_file), plugins={"spy": spy})
    uploads = [reply.arrays for _, _, reply in messages if reply.kind == "fit"]
    assert len(uploads) == 2 * 3
    for upload in uploads:  # backbone and task head of the small model (the proxy on site0)
        assert {k.split(".")[0] for k in upload} == {"backbone", "head"}
        assert upload["head.weight"].shape == (4, 64)  # ResNet-20's 64 features, 4 classes
        params = sum(
            v.numel() for k, v in upload.items() if "running" not in k and "num_b" not in k
        )
        assert params < 0.3e6  # ResNet-20, not the ResNet-32
    downs = [m.arrays for _, m, _ in messages if m.kind == "fit"]
    assert all("head.weight" in arrays for arrays in downs)  # the global state has the head
    round2 = [
        (cid, m.arrays) for cid, m, _ in messages if m.kind == "fit" and m.scalars["round"] == 2
    ]
    for _, arrays in round2:  # every client starts round 2 from the same averaged model
        assert torch.equal(arrays["head.weight"], round2[0][1]["head.weight"])
    for _, message, reply in messages:  # surrogate, scores, large model: in no message
        for arrays in (message.arrays, reply.arrays):
            assert not any("extras" in k or "fedhelp" in k for k in arrays)
    final = results.final
    assert final["global"]["bacc"] >= 0  # the averaged small model, pooled
    assert set(final["clients"]) == {"site0", "site1", "site2"}
    served = final["views"]["served"]["clients"]
    averaged = final["views"]["global"]["clients"]
    assert served["site1"] == averaged["site1"]  # a small client serves the global model
    assert served["site0"] != averaged["site0"]  # the large client its large model
    assert final["clients"]["site0"] == served["site0"]
    train = results.rounds[-1]["train"]
    assert {"loss.fedhelp.kd_f", "loss.fedhelp.kd_b", "loss.fedhelp.large_task"} <= set(
        train["site0"]
    )
    assert "loss.fedhelp.public" not in train["site0"]
    assert "loss.fedhelp.public" in train["site1"] and "loss.fedhelp.kd_b" not in train["site1"]
    # private parts: the large model on the large client only, scores learned, all kept
    small, large = spy.end[1, "site1"], spy.end[1, "site0"]
    assert any(k.startswith(f"extras.{fh.LARGE}.") for k in large)
    assert not any(k.startswith(f"extras.{fh.SURROGATE}.") for k in large)
    assert not any(k.startswith("head.") for k in small)  # the head is shared, not private
    scores = small[f"extras.{fh.SCORES}.logits"]
    assert scores.shape == (12, 2) and scores.abs().sum() > 0  # learned from zeros
    for cid in ("site0", "site1"):
        before = spy.start[2, cid]
        assert all(torch.equal(before[k], v) for k, v in spy.end[1, cid].items())


@pytest.mark.slow
def test_flower_engine_runs_different_architectures_per_node(knowledge_file):
    cfg = config(knowledge_file, engine="flower", flower={"backend": "thread"}, rounds=1)
    results = run(cfg)
    assert set(results.final["clients"]) == {"site0", "site1", "site2"}


def test_roles_from_own_size_and_bad_settings(knowledge_file):
    cfg = {**config(knowledge_file), "model": "cnn"}
    cfg["fedhelp"] = {"knowledge": str(knowledge_file), "large_min_size": 10**6}
    results = run({**cfg, "rounds": 1})
    assert all("loss.fedhelp.public" in t for t in results.rounds[0]["train"].values())
    with pytest.raises(FedkitError, match="exactly one"):
        run({**cfg, "fedhelp": {"knowledge": str(knowledge_file)}})
    with pytest.raises(FedkitError, match="unknown clients"):
        run({**cfg, "fedhelp": {"knowledge": str(knowledge_file), "large_clients": ["nope"]}})


def test_num_large_the_server_ranks_reported_sizes_each_client_learns_its_role(
    knowledge_file, messages
):
    fractions = {"kind": "fractions", "fractions": [0.2, 0.5, 0.3]}
    options = {"knowledge": str(knowledge_file), "num_large": 1, "large_model": "cnn"}
    spy = Spy()
    cfg = tiny(plugins=["fedhelp"], partition=fractions, fedhelp=options, batch_size=32)
    results = run(cfg, plugins={"spy": spy})
    first, second = (r["train"] for r in results.rounds)
    assert all("loss.fedhelp.public" in t for t in first.values())  # roles unknown in round 1
    assert "loss.fedhelp.kd_b" in second["c1"] and "loss.fedhelp.public" not in second["c1"]
    assert all("loss.fedhelp.public" in second[c] for c in ("c0", "c2"))
    assert bool(spy.end[2, "c1"][f"extras.{fh.LARGE}.on"])
    assert not bool(spy.end[2, "c0"][f"extras.{fh.LARGE}.on"])
    sizes = {cid: r.scalars["num_examples"] for cid, m, r in messages if m.kind == "fit"}
    assert max(sizes, key=sizes.get) == "c1" and len(set(sizes.values())) == 3
    for cid, message, _ in messages:
        payload = {k: v for k, v in message.scalars.items() if k.startswith("payload/")}
        if message.kind == "fit" and message.scalars["round"] == 2:
            assert payload == {"payload/fedhelp.large": cid == "c1"}  # its own role only
        else:
            assert payload == {}
        assert not any(k.startswith("payload/") for k in message.arrays)
        others = {v for c, v in sizes.items() if c != cid}
        assert not others & {v for v in message.scalars.values() if isinstance(v, int)}
        assert all(k.split(".")[0] in ("backbone", "head") for k in message.arrays)  # no sizes


def test_role_options_are_exclusive(knowledge_file):
    base = {"knowledge": str(knowledge_file)}
    with pytest.raises(FedkitError, match="exactly one.*given: large_clients, num_large"):
        run(tiny(plugins=["fedhelp"], fedhelp={**base, "num_large": 1, "large_clients": ["x"]}))
    with pytest.raises(FedkitError, match="leaves no small client"):
        run(tiny(plugins=["fedhelp"], fedhelp={**base, "num_large": 3}))


@pytest.mark.slow
def test_large_pretrained_asks_the_core_model_builder(knowledge_file, monkeypatch):
    asked = []
    build = fh.build_model

    def recording(task, name, pretrained=False, **kwargs):
        asked.append((name, pretrained))
        return build(task, name, **kwargs)  # random weights: no hub offline

    monkeypatch.setattr(fh, "build_model", recording)
    cfg = config(knowledge_file, rounds=1)
    cfg["fedhelp"]["large_pretrained"] = True
    run(cfg)
    assert asked == [("resnet32", True)]  # on the large client only
