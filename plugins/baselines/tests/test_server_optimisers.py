"""FedAdam, FedYogi, FedAdagrad and FedAvgM against Flower's own strategies on the same client
updates (numpy arrays through flwr's Message-API strategy code), and the entries they leave
to FedAvg. Their state surviving a SIGKILL: test_resume_after_sigkill.py."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedkit_core.plugin import Update, plugin_scope, weighted_average

flwr = pytest.importorskip("flwr")

from fedkit_baselines.flower_strategy import message_identity, round_grid  # noqa: E402
from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import strategy as flower  # noqa: E402

SHAPES = {"conv.weight": (4, 3), "conv.bias": (4,), "head.weight": (2, 4)}
NAMES = sorted(SHAPES)


def fedkit_server(plugin: str, options: dict, state: dict, round: int):
    return SimpleNamespace(
        options=lambda: options,
        state=state,
        global_state={},
        round=round,
        config={"seed": 0},
        task=SimpleNamespace(client_ids=["a", "b", "c"]),
    )


def client_rounds(seed: int = 0, rounds: int = 3):
    """Per round: the clients' models around a drifting centre, and their sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for rnd in range(rounds):
        clients = ["a", "b", "c"] if rnd != 1 else ["a", "c"]  # partial participation
        models = {
            c: {k: rng.normal(0.1 * rnd, 1.0, size=s).astype(np.float32) for k, s in SHAPES.items()}
            for c in clients
        }
        sizes = {c: int(rng.integers(5, 50)) for c in clients}
        out.append((models, sizes))
    return out


def flower_rounds(strategy, x0: dict[str, np.ndarray], rounds) -> list[dict[str, np.ndarray]]:
    """Flower's strategy driven as its ServerApp would: configure_train, then
    aggregate_train on the clients' replies, each round from its previous result."""
    current, out = dict(x0), []
    for rnd, (models, sizes) in enumerate(rounds, start=1):
        nodes = list(range(1, len(models) + 1))
        with message_identity():
            arrays = ArrayRecord({k: Array(v) for k, v in current.items()})
            strategy.configure_train(rnd, arrays, ConfigRecord(), round_grid(nodes))
            replies = []
            for node, cid in zip(nodes, models):
                asked = Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
                content = RecordDict(
                    {
                        "arrays": ArrayRecord({k: Array(v) for k, v in models[cid].items()}),
                        "metrics": MetricRecord({"num-examples": sizes[cid]}),
                    }
                )
                replies.append(Message(content, reply_to=asked))
            new, _ = strategy.aggregate_train(rnd, replies)
        current = {k: np.asarray(new[k].numpy()) for k in current}
        out.append(current)
    return out


def fedkit_rounds(plugin: str, options: dict, x0, rounds) -> list[dict[str, np.ndarray]]:
    module = importlib.import_module(f"fedkit_baselines.{plugin}")
    state = {"params": NAMES}
    current = {k: torch.from_numpy(v.copy()) for k, v in x0.items()}
    out = []
    for rnd, (models, sizes) in enumerate(rounds, start=1):
        server = fedkit_server(plugin, options, state, rnd)
        server.global_state = current
        updates = [
            Update(c, {k: torch.from_numpy(v) for k, v in m.items()}, {"num_examples": sizes[c]})
            for c, m in models.items()
        ]
        with plugin_scope(plugin):
            current = module.fedkit_aggregate(server=server, updates=updates, ask=None)
        out.append({k: v.numpy() for k, v in current.items()})
    return out


CASES = {
    "fedadam": (
        lambda: flower.FedAdam(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-3),
        {"eta": 0.05, "beta1": 0.8, "beta2": 0.95, "tau": 1e-3, "bias_correction": "flower"},
    ),
    "fedyogi": (
        lambda: flower.FedYogi(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-3),
        {"eta": 0.05, "beta1": 0.8, "beta2": 0.95, "tau": 1e-3},
    ),
    "fedadagrad": (
        lambda: flower.FedAdagrad(eta=0.05, tau=1e-3),
        {"eta": 0.05, "beta1": 0.0, "tau": 1e-3},  # Flower's FedAdagrad has no momentum
    ),
    "fedavgm": (
        lambda: flower.FedAvgM(server_learning_rate=0.7, server_momentum=0.9),
        {"eta": 0.7, "momentum": 0.9},
    ),
}


@pytest.mark.parametrize("plugin", sorted(CASES))
def test_the_aggregate_equals_flowers_strategy_on_the_same_updates(plugin):
    make, options = CASES[plugin]
    x0 = {k: np.random.default_rng(9).normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
    rounds = client_rounds()
    theirs = flower_rounds(make(), x0, rounds)
    mine = fedkit_rounds(plugin, options, x0, rounds)
    for rnd, (a, b) in enumerate(zip(mine, theirs), start=1):
        for key in NAMES:
            scale = max(1.0, float(np.abs(b[key]).max()))
            assert np.abs(a[key] - b[key]).max() <= 1e-5 * scale, (plugin, rnd, key)
    # the optimiser moved the model away from plain FedAvg (the test can fail)
    first_mean = weighted_average(
        [{k: torch.from_numpy(v) for k, v in m.items()} for m in rounds[0][0].values()],
        list(rounds[0][1].values()),
    )
    assert max(np.abs(mine[0][k] - first_mean[k].numpy()).max() for k in NAMES) > 1e-3


def test_the_papers_fedadam_differs_from_flowers_only_by_the_bias_correction():
    make, options = CASES["fedadam"]
    x0 = {k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}
    rounds = client_rounds(rounds=1)
    flower_step = fedkit_rounds("fedadam", options, x0, rounds)[0]
    paper_step = fedkit_rounds("fedadam", {**options, "bias_correction": "none"}, x0, rounds)[0]
    b1, b2 = options["beta1"], options["beta2"]
    scale = np.sqrt(1 - b2**2) / (1 - b1**2)  # Flower's factor in round 1
    for key in NAMES:
        assert np.allclose(flower_step[key], scale * paper_step[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("plugin", sorted(CASES))
def test_buffers_and_counters_take_the_fedavg_mean(plugin):
    module = importlib.import_module(f"fedkit_baselines.{plugin}")
    glob = {
        "w": torch.zeros(3),
        "bn.running_mean": torch.zeros(3),
        "bn.num_batches_tracked": torch.tensor(0),
    }
    clients = [
        {
            "w": torch.ones(3),
            "bn.running_mean": torch.full((3,), 2.0),
            "bn.num_batches_tracked": torch.tensor(4),
        },
        {
            "w": torch.ones(3),
            "bn.running_mean": torch.full((3,), 5.0),
            "bn.num_batches_tracked": torch.tensor(8),
        },
    ]
    server = fedkit_server(plugin, CASES[plugin][1], {"params": ["w"]}, 1)
    server.global_state = glob
    updates = [Update(c, s, {"num_examples": n}) for c, s, n in zip("ab", clients, (30, 10))]
    with plugin_scope(plugin):
        new = module.fedkit_aggregate(server=server, updates=updates, ask=None)
    assert torch.allclose(new["bn.running_mean"], torch.full((3,), 2.75))
    assert new["bn.num_batches_tracked"].item() == 5 and not new["w"].equal(torch.ones(3))
    assert set(server.state) > {"params"}, "the optimiser keeps its state in server.state"


def test_fedavgm_without_momentum_at_rate_one_is_fedavg():
    x0 = {k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}
    rounds = client_rounds(rounds=2)
    mine = fedkit_rounds("fedavgm", {"eta": 1.0, "momentum": 0.0}, x0, rounds)
    for out, (models, sizes) in zip(mine, rounds):
        mean = weighted_average(
            [{k: torch.from_numpy(v) for k, v in m.items()} for m in models.values()],
            list(sizes.values()),
        )
        for key in NAMES:
            assert np.allclose(out[key], mean[key].numpy(), atol=1e-6)
