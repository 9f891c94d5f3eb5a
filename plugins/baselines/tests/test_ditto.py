"""Ditto: the proximal term by hand, the personal model never uploaded, Flower and segmentation."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from fedkit_baselines import ditto
from torch import nn

from fedkit_core import run
from fedkit_core.plugin import FedModel, plugin_scope
from fedkit_core.testing import tiny, tiny_seg

from .baseline_probes import Uploads, Watch, same


def _client(lam: float) -> SimpleNamespace:
    model = FedModel(nn.Linear(3, 4), nn.Linear(4, 2), 4)
    with plugin_scope("ditto"):
        ditto.fedkit_extend_model(model, SimpleNamespace(client_id="a"))
    return SimpleNamespace(
        model=model,
        state={},
        scratch={},
        options=lambda: {"lambda": lam},
        task_loss=lambda batch, outputs: F.cross_entropy(outputs["logits"], batch.y),
    )


def test_personal_model_starts_at_the_global_one_and_its_proximal_term_matches_by_hand():
    client = _client(lam=0.4)
    with plugin_scope("ditto"):
        ditto.fedkit_round_start(client)
    personal = client.model.extras[ditto.PERSONAL]
    assert torch.equal(personal.head.weight, client.model.head.weight)
    with torch.no_grad():
        personal.head.weight += 0.5  # 8 entries moved by 0.5 from the received global model
    batch = SimpleNamespace(x=torch.randn(5, 3), y=torch.tensor([0, 1, 0, 1, 1]))
    with plugin_scope("ditto"):
        terms = ditto.fedkit_loss_terms(client, batch, client.model(batch.x))
    assert terms["ditto.proximal"].item() == pytest.approx(0.5 * 0.4 * 0.5**2 * 8)
    expected = F.cross_entropy(personal(batch.x), batch.y)
    assert terms["ditto.personal"].item() == pytest.approx(expected.item())
    # the personal loss trains the personal model only, not the global one
    terms["ditto.personal"].backward()
    assert client.model.head.weight.grad is None and personal.head.weight.grad is not None


@pytest.mark.slow
def test_personal_model_never_uploaded_and_kept_across_rounds():
    uploads, watch = Uploads(), Watch(f"extras.{ditto.PERSONAL}")
    results = run(
        tiny(rounds=3, ditto={"lambda": 0.1}),
        plugins={"ditto": ditto, "uploads": uploads, "watch": watch},
    )
    for round_updates in uploads.updates:
        for arrays in round_updates.values():
            assert arrays and not any("ditto" in key or "extras" in key for key in arrays)
    # the personal model trains, and the next round starts from it, not from the global model
    ended = {key: state for key, state in watch.end.items()}
    for (cid, rnd), state in ended.items():
        assert not same(watch.start[(cid, rnd)], state)
        if (cid, rnd + 1) in watch.start:
            assert same(watch.start[(cid, rnd + 1)], state)
    assert results.final["clients"] and results.final["global"]
    assert set(results.final["views"]) == {"global", "personal"}


@pytest.mark.slow
def test_flower_gives_the_local_engines_results():
    pytest.importorskip("flwr")
    config = tiny(rounds=2)
    local = run(config, plugins={"ditto": ditto})
    flower = run(
        {**config, "engine": "flower", "flower": {"backend": "thread"}}, plugins={"ditto": ditto}
    )
    assert _close(flower.final["clients"], local.final["clients"])
    assert _close(flower.final["global"], local.final["global"])


def _close(a: dict, b: dict, tol: float = 1e-6) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    return abs(a - b) <= tol


def test_segmentation_scores_clients_with_their_personal_model():
    results = run(tiny_seg(rounds=1), plugins={"ditto": ditto})
    assert all("dice" in m for m in results.final["clients"].values())
    assert "personal" in results.final["views"]
