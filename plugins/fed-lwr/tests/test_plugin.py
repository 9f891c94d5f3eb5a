"""The hooks: the server's anchor round trip, the client's answer, whole federations."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from fedkit_fed_lwr import plugin

from fedkit_core import run
from fedkit_core.plugin import FedkitError, Reply, ServerContext, Update, plugin_scope
from fedkit_core.testing import (
    ClientRuntime,
    Message,
    all_tasks,
    prepare,
    resolve_config,
    shared_data,
    tiny_seg,
)

from .nets import ClassicUNet


def server_for(**overrides) -> ServerContext:
    cfg, _ = resolve_config(tiny_seg(plugins=["fed-lwr"], **overrides))
    return ServerContext(task=None, config=cfg, device=torch.device("cpu"))


def client_states(n: int) -> list[dict[str, torch.Tensor]]:
    states = []
    for k in range(n):
        torch.manual_seed(k)
        states.append({key: v.clone() for key, v in ClassicUNet().state_dict().items()})
    return states


def test_aggregate_sends_the_uniform_anchor_and_reweights_each_layer():
    states = client_states(3)
    updates = [Update(f"c{k}", s, {"num_examples": 10 * (k + 1)}) for k, s in enumerate(states)]
    sims = {"c0": 0.9, "c1": 0.6, "c2": 0.95}  # for layer enc1.0; enc1.1 gets equal ones
    asked = {}

    def ask(query, arrays=None, scalars=None, clients=None):
        asked.update(query=query, arrays=arrays)
        return {
            cid: Reply(scalars={"fed-lwr.cka.enc1.0": s, "fed-lwr.cka.enc1.1": 0.5})
            for cid, s in sims.items()
        }

    with plugin_scope("fed-lwr"):
        out = plugin.fedkit_aggregate(server=server_for(), updates=updates, ask=ask)
    assert asked["query"] == "fed-lwr.cka"
    uniform = {k: sum(s[k].double() for s in states) / 3 for k in states[0]}
    for key, value in asked["arrays"].items():  # uniform, not weighted by num_examples
        if value.dtype.is_floating_point:
            assert torch.allclose(value.double(), uniform[key], atol=1e-6), key
    rho = torch.tensor([0.1, 0.4, 0.05]) / 0.55
    expected = sum(r * s["enc1.0.weight"] for r, s in zip(rho, states))
    assert torch.allclose(out["enc1.0.weight"], expected, atol=1e-6)
    for key in ("enc1.1.weight", "enc1.1.running_var", "dec1.0.weight", "out.bias"):
        assert torch.allclose(out[key].double(), uniform[key], atol=1e-6), key
    assert set(out) == set(states[0])


def test_aggregate_falls_back_to_uniform_when_a_client_measured_nothing(caplog):
    states = client_states(2)
    updates = [Update(f"c{k}", s, {"num_examples": 5}) for k, s in enumerate(states)]
    replies = {"c0": Reply(scalars={"fed-lwr.cka.enc1.0": 0.3}), "c1": Reply(scalars={})}
    server = server_for()
    with caplog.at_level(logging.WARNING, "fedkit.fed-lwr"), plugin_scope("fed-lwr"):
        out = plugin.fedkit_aggregate(server=server, updates=updates, ask=lambda *a, **k: replies)
    uniform = (states[0]["enc1.0.weight"] + states[1]["enc1.0.weight"]) / 2
    assert torch.allclose(out["enc1.0.weight"], uniform, atol=1e-6)
    assert "c1 measured no similarity" in caplog.text


def test_model_granularity_weighs_every_entry_with_one_layer():
    states = client_states(2)
    updates = [Update(f"c{k}", s, {"num_examples": 5}) for k, s in enumerate(states)]
    replies = {
        "c0": Reply(scalars={"fed-lwr.cka.bottleneck.4": 0.8}),
        "c1": Reply(scalars={"fed-lwr.cka.bottleneck.4": 0.4}),
    }
    server = server_for(**{"fed-lwr.granularity": "model"})
    with plugin_scope("fed-lwr"):
        out = plugin.fedkit_aggregate(server=server, updates=updates, ask=lambda *a, **k: replies)
    for key in ("enc1.0.weight", "up1.bias", "out.weight"):
        expected = 0.25 * states[0][key] + 0.75 * states[1][key]
        assert torch.allclose(out[key], expected, atol=1e-6), key


@pytest.fixture(scope="module")
def client() -> ClientRuntime:
    cfg, plugins = resolve_config(tiny_seg(plugins=["fed-lwr"]))
    fed = prepare(cfg, plugins)
    cid = next(iter(fed.clients))
    runtime = ClientRuntime(cid, fed.clients[cid], fed.task, cfg, plugins, torch.device("cpu"))
    runtime.handle(Message("setup"))
    return runtime


def test_client_answers_with_one_cka_per_named_layer(client):
    model = client.ctx.model
    state = model.shared_state()
    reply = client.handle(Message("query", state, {"query": "fed-lwr.cka", "round": 1}))
    names = {k.removeprefix("fed-lwr.cka.") for k in reply.scalars if k.startswith("fed-lwr.cka.")}
    convs_and_norms = {
        n
        for n, m in model.named_modules()
        if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d, torch.nn.BatchNorm2d))
    }
    assert names == convs_and_norms
    assert all(reply.scalars[f"fed-lwr.cka.{n}"] == pytest.approx(1.0, abs=1e-5) for n in names)
    assert set(reply.scalars) == {f"fed-lwr.cka.{n}" for n in names}  # nothing else goes up
    with plugin_scope("fed-lwr"):
        other = plugin.fedkit_answer_query(client=client.ctx, query="other", arrays={}, scalars={})
    assert other is None


def test_client_cka_drops_for_a_different_anchor(client):
    state = client.ctx.model.shared_state()
    moved = {
        k: v + 0.2 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()
    }
    with plugin_scope("fed-lwr"):
        reply = plugin.fedkit_answer_query(
            client=client.ctx, query="fed-lwr.cka", arrays=moved, scalars={}
        )
    values = [v for k, v in reply.scalars.items() if k.startswith("fed-lwr.cka.")]
    assert min(values) < 0.999  # the same anchor gives 1 within 1e-5
    after = client.ctx.model.shared_state()  # the anchor was a copy: the local model is intact
    assert all(torch.equal(after[k], v) for k, v in state.items())


def test_three_site_federation_reweights_layers(caplog, tmp_path):
    config = tiny_seg(plugins=["fed-lwr"], rounds=2, **{"fed-lwr.clip": [1e-4, 0.999999]})
    with caplog.at_level(logging.DEBUG, "fedkit.fed-lwr"):
        results = run(config, out=tmp_path)
    assert results["status"] == "complete"
    assert set(results.final["clients"]) == {"site0", "site1", "site2"}
    assert {"std", "worst"} <= set(results.final["fairness"])
    measured = re.findall(
        r"round (\d): (site\d) similarity mean [\d.]+ min [\d.]+ over (\d+)", caplog.text
    )
    assert len(measured) == 6 and all(int(n) > 10 for _, _, n in measured)
    weights = re.findall(r"(site\d)=([\d.]+) \[([\d.]+), ([\d.]+)\]", caplog.text)
    assert any(lo != hi for _, _, lo, hi in weights)  # the weights differ across layers
    summary = results.final["summary"]  # the weights' record, in results.json and metrics.csv
    assert 0 <= summary["fed-lwr.uniform_share_all"] < 1 and summary["fed-lwr.max_dev"] > 0
    assert "fed-lwr.uniform_share" in (tmp_path / "metrics.csv").read_text()


def test_ablations_run_end_to_end(caplog):
    config = tiny_seg(
        plugins=["fed-lwr"],
        rounds=1,
        **{"fed-lwr.similarity": "cosine", "fed-lwr.granularity": "model"},
    )
    with caplog.at_level(logging.DEBUG, "fedkit.fed-lwr"):
        results = run(config)
    assert results["status"] == "complete"
    assert re.findall(r"over (\d+) layers", caplog.text) == ["1", "1", "1"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"fed-lwr.batch_size": 2}, "at least 4"),
        ({"fed-lwr.layer": "backbone.x"}, "only used with fed-lwr.granularity=model"),
        ({"fed-lwr.clip": [0.5, 1.0]}, "fed-lwr.clip"),
        ({"fed-lwr.passes": 0}, "fed-lwr.passes.*>= 1"),  # the option's range, at resolution
    ],
)
def test_bad_options_are_refused(overrides, message):
    with pytest.raises(FedkitError, match=message):
        run(tiny_seg(plugins=["fed-lwr"], rounds=1, **overrides))


@pytest.mark.realdata
def test_prostate_layout_runs_with_six_clients():
    if "prostate" not in all_tasks():
        pytest.skip("the prostate task is not registered in this fedkit (it ships separately)")
    path = shared_data("seg", "site_samples", "midss_fundus4_prostate6", "ProstateSlice")
    results = run(
        {
            "task": {"name": "prostate", "path": str(path), "image_size": 32},
            "plugins": ["fed-lwr"],
            "unet_channels": [4, 8, 16],
            "rounds": 1,
            "checkpoint": False,
        }
    )
    assert len(results.final["clients"]) == 6


def test_passes_repeat_the_split_in_whole_blocks(client):
    val = len(client.ctx.data["val"])
    one = list(plugin._inputs(client.ctx, "val", 4, {"similarity": "cka", "passes": 1}))
    two = list(plugin._inputs(client.ctx, "val", 4, {"similarity": "cka", "passes": 2}))
    assert sum(len(x) for x in one) == val and sum(len(x) for x in two) == 2 * val
    cosine = list(plugin._inputs(client.ctx, "val", 4, {"similarity": "cosine", "passes": 1}))
    assert all(len(x) <= 4 for x in cosine)  # cosine keeps features: forward one block at a time


@pytest.mark.parametrize("split", [None, "train", "val"])
def test_cka_is_measured_on_training_data_by_default(split, monkeypatch):
    """The paper's Eq. 3 measures CKA on the client's training data (the default); the
    authors' code on its validation split (``split: val``)."""
    options = {} if split is None else {"fed-lwr": {"split": split}}
    cfg, plugins = resolve_config(tiny_seg(plugins=["fed-lwr"], **options))
    fed = prepare(cfg, plugins)
    cid = next(iter(fed.clients))
    runtime = ClientRuntime(cid, fed.clients[cid], fed.task, cfg, plugins, torch.device("cpu"))
    runtime.handle(Message("setup"))
    seen = []
    batches = runtime.ctx.batches

    def spy(name, *args, **kwargs):
        seen.append(name)
        return batches(name, *args, **kwargs)

    monkeypatch.setattr(runtime.ctx, "batches", spy)
    reply = runtime.handle(
        Message("query", runtime.ctx.model.shared_state(), {"query": "fed-lwr.cka", "round": 1})
    )
    assert reply.scalars and set(seen) == {split or "train"}


@pytest.mark.slow
def test_eq5_weighting_runs_end_to_end_and_records_its_weights():
    results = run(tiny_seg(plugins=["fed-lwr"], rounds=1, **{"fed-lwr.weighting": "eq5"}))
    assert results["status"] == "complete"
    assert results.final["summary"]["fed-lwr.uniform_share_all"] < 1  # nothing clipped away
