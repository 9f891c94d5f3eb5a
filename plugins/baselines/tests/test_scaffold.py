"""SCAFFOLD: option II against the paper's formula under plain SGD, option I's gradient, the
server's variate and model steps by hand, and the variates' bytes counted on the wire."""

from __future__ import annotations

from types import SimpleNamespace

import fedkit_baselines.scaffold as scaffold
import pytest
import torch
from torch import nn

from fedkit_core import run
from fedkit_core.plugin import Batch, Update, hookimpl, plugin_scope
from fedkit_core.testing import tiny

SGD = {"optimizer": "sgd", "momentum": 0.0, "lr": 0.05}


class Paper:
    """Checks each client's new ``c_i`` against Algorithm 1's option II,
    ``c_i - c + (x - y_i) / (K lr)``, from what the client holds (runs after scaffold)."""

    def __init__(self) -> None:
        self.errors: list[float] = []
        self.sizes: dict[str, int] = {}

    @hookimpl
    def fedkit_round_start(self, client):
        s = client.scratch
        s["x"] = {n: p.detach().clone() for n, p in client.model.named_parameters()}
        s["ci"] = {n: v.clone() for n, v in client.states["scaffold"]["ci"].items()}
        s["steps"] = 0
        self.sizes = {n: v.numel() for n, v in s["ci"].items()}

    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        client.scratch["steps"] += 1

    @hookimpl
    def fedkit_client_report(self, client):
        s, prefix = client.scratch, len(scaffold.VARIATE)
        c = {
            k[prefix:]: v
            for k, v in client.received.arrays.items()
            if k.startswith(scaffold.VARIATE)
        }
        y = dict(client.model.named_parameters())
        new = client.states["scaffold"]["ci"]
        for n in c:
            paper = s["ci"][n] - c[n] + (s["x"][n] - y[n].detach()) / (s["steps"] * client.lr)
            self.errors.append(
                float((paper - new[n]).abs().max()) / max(1.0, float(new[n].abs().max()))
            )


def test_option_ii_is_the_papers_formula_under_plain_sgd():
    paper = Paper()
    results = run(tiny(rounds=3, plugins=["scaffold"], **SGD), plugins={"paper": paper})
    assert len(paper.errors) > 10 and max(paper.errors) < 1e-5
    assert results.final["global"]["bacc"] >= 0


def test_the_variates_bytes_are_counted_both_ways():
    paper = Paper()
    config = tiny(rounds=2, eval_test="every", **SGD)  # the same evaluation messages
    plain = run(config)
    controlled = run({**config, "plugins": ["scaffold"]}, plugins={"paper": paper})
    names = sorted(paper.sizes)
    variate = 4 * sum(paper.sizes.values())
    down = variate + sum(len(f"payload/{scaffold.VARIATE}{n}") for n in names)
    up = variate + sum(len(f"payload/{scaffold.DELTA}{n}") for n in names)
    up += 8 + len("loss.scaffold.correction")  # the term's mean, reported like every term
    for mine, base in zip(controlled.rounds, plain.rounds, strict=True):
        for cid in base["bytes"]:
            assert mine["bytes"][cid]["down"] - base["bytes"][cid]["down"] == down
            assert mine["bytes"][cid]["up"] - base["bytes"][cid]["up"] == up
    assert up > 0.4 * plain.rounds[0]["bytes"]["site0"]["up"], "parameters: most of the upload"


def test_the_server_moves_the_variate_by_the_mean_change_over_all_clients():
    glob = {"w": torch.tensor([1.0, 2.0]), "bn.running_mean": torch.zeros(2)}
    server = SimpleNamespace(
        options=lambda: {"eta": 0.5, "variate": "II"},
        state={"params": ["w"], "c": {"w": torch.tensor([0.3, -0.3])}},
        global_state=glob,
        task=SimpleNamespace(client_ids=["a", "b", "c"]),  # c sits this round out
    )
    updates = [
        Update(
            "a",
            {"w": torch.tensor([3.0, 2.0]), "bn.running_mean": torch.ones(2)},
            {"num_examples": 30},
            payload={"scaffold.dc/w": torch.tensor([0.6, 0.0])},
        ),
        Update(
            "b",
            {"w": torch.tensor([-1.0, 6.0]), "bn.running_mean": torch.full((2,), 3.0)},
            {"num_examples": 10},
            payload={"scaffold.dc/w": torch.tensor([0.3, 0.9])},
        ),
    ]
    with plugin_scope("scaffold"):
        new = scaffold.fedkit_aggregate(server=server, updates=updates, ask=None)
    # c + (0.6 + 0.3, 0 + 0.9) / 3 clients
    assert torch.allclose(server.state["c"]["w"], torch.tensor([0.6, 0.0]), atol=1e-6)
    # mean by examples (2.0, 3.0); x + 0.5 * (mean - x)
    assert torch.allclose(new["w"], torch.tensor([1.5, 2.5]))
    assert torch.allclose(new["bn.running_mean"], torch.full((2,), 1.5))  # buffers: the mean


def test_option_i_is_the_task_loss_gradient_over_the_training_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    client = SimpleNamespace(
        model=model,
        batches=lambda split: (
            Batch(x[i : i + 4], y[i : i + 4], torch.arange(i, min(i + 4, 10)))
            for i in range(0, 10, 4)
        ),
        task_loss=lambda batch, out: nn.functional.cross_entropy(out, batch.y),
        forward=lambda m, inputs: m(inputs),
    )
    names = ["0.weight", "0.bias"]
    got = scaffold.full_gradient(client, names)
    expected = torch.autograd.grad(
        nn.functional.cross_entropy(model(x), y), list(model.parameters())
    )
    for n, e in zip(names, expected):
        assert torch.allclose(got[n], e, atol=1e-6)


def test_option_i_with_adam_corrects_from_the_second_round_on():
    results = run(tiny(rounds=2, plugins=["scaffold"], scaffold={"variate": "I"}))
    first, second = (r["train"] for r in results.rounds)
    assert all(t["loss.scaffold.correction"] == 0.0 for t in first.values())  # c = c_i = 0
    assert all(t["loss.scaffold.correction"] != 0.0 for t in second.values())


def test_a_private_run_refuses_scaffold_naming_its_variates_before_any_data():
    from fedkit_core import FedkitError, resolve_config
    from fedkit_core.testing import tiny

    for private in (
        {"dp": {"level": "client", "noise_multiplier": 1.0}},
        {"secagg": {"enabled": True}},
    ):
        with pytest.raises(FedkitError, match="scaffold.dc/"):
            resolve_config([tiny(plugins=["scaffold"], **private)])


def test_control_variates_leave_out_the_frozen_parameters():
    """Plugins extend the model before the core freezes it: the server's variate must not
    cover what `freeze` stops the clients training (it did, and every client refused it)."""
    results = run(tiny(rounds=2, plugins=["scaffold"], freeze=["backbone.features.0"], **SGD))
    assert results["status"] == "complete"
