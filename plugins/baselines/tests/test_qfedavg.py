"""q-FedAvg's server step against hand computations (q = 0 is FedAvg with uniform weights),
the loss each client reports, and FedLC + q-FedAvg on the local engine and on Flower."""

from types import SimpleNamespace

import fedkit_baselines.fedlc as fedlc
import fedkit_baselines.qfedavg as qfedavg
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core import FedkitError, run
from fedkit_core.plugin import Batch, FedModel, Update, plugin_scope, weighted_average

from .lossfakes import small

CONFIG = {"lr": 0.1, "lr_schedule": "none", "lr_gamma": 0.1, "lr_milestones": []}


def server(global_state, q, lipschitz=None, config=CONFIG, round=1):
    return SimpleNamespace(
        options=lambda: {"q": q, "lipschitz": lipschitz},
        config=config,
        round=round,
        global_state=global_state,
    )


def update(cid, arrays, loss, sqdist, n=10):
    return Update(cid, arrays, {"num_examples": n, qfedavg.LOSS: loss, qfedavg.DISTANCE: sqdist})


def aggregate(srv, updates):
    with plugin_scope("qfedavg"):
        return qfedavg.fedkit_aggregate(srv, updates, ask=None)


def test_q_zero_is_the_uniform_mean_of_the_client_models():
    torch.manual_seed(0)
    glob = {"w": torch.randn(3, 2), "b": torch.randn(2)}
    states = [{k: v + torch.randn_like(v) for k, v in glob.items()} for _ in range(3)]
    updates = [
        update(f"c{i}", s, loss=0.5 + i, sqdist=1.0 + i, n=10 * (i + 1))
        for i, s in enumerate(states)
    ]
    new = aggregate(server(glob, q=0.0), updates)
    mean = weighted_average(states, [1, 1, 1])
    for key in glob:
        assert torch.allclose(new[key], mean[key], atol=1e-6)


def test_q_one_matches_hand_computation_with_l_from_the_learning_rate():
    # w^t = 1, L = 1/lr = 10; client a: w = 0, F = 2, ||dw||^2 = 1; client b: w = 0.5, F = 1
    glob = {"w": torch.tensor([1.0])}
    updates = [
        update("a", {"w": torch.tensor([0.0])}, loss=2.0, sqdist=1.0),
        update("b", {"w": torch.tensor([0.5])}, loss=1.0, sqdist=0.25),
    ]
    # Delta_a = 2*10*1 = 20, Delta_b = 1*10*0.5 = 5; h_a = 100*1 + 10*2 = 120, h_b = 25 + 10
    new = aggregate(server(glob, q=1.0), updates)
    assert new["w"].item() == pytest.approx(1 - 25 / 155, rel=1e-6)
    # an explicit L replaces 1/lr: L = 1 -> h_a = 1 + 2, h_b = 0.25 + 1, Delta = 2 + 0.5
    new = aggregate(server(glob, q=1.0, lipschitz=1.0), updates)
    assert new["w"].item() == pytest.approx(1 - 2.5 / 4.25, rel=1e-6)


def test_the_learning_rate_schedule_sets_l():
    glob = {"w": torch.tensor([1.0])}
    updates = [update("a", {"w": torch.tensor([0.0])}, loss=2.0, sqdist=1.0)]
    step = {**CONFIG, "lr_schedule": "step", "lr_milestones": [2]}  # round 2: lr 0.01, L 100
    new = aggregate(server(glob, q=1.0, config=step, round=2), updates)
    assert new["w"].item() == pytest.approx(1 - 200 / (1e4 + 200), rel=1e-6)


def test_integer_entries_are_averaged_by_examples():
    glob = {"w": torch.tensor([1.0]), "count": torch.tensor(0)}
    updates = [
        update("a", {"w": torch.tensor([0.0]), "count": torch.tensor(4)}, 1.0, 1.0, n=30),
        update("b", {"w": torch.tensor([0.0]), "count": torch.tensor(8)}, 1.0, 1.0, n=10),
    ]
    new = aggregate(server(glob, q=0.5), updates)
    assert new["count"].item() == 5 and new["count"].dtype == torch.int64


def test_a_client_without_its_report_is_an_error():
    updates = [Update("a", {"w": torch.tensor([0.0])}, {"num_examples": 3})]
    with pytest.raises(FedkitError, match="qfedavg"):
        aggregate(server({"w": torch.tensor([1.0])}, q=1.0), updates)


def test_clients_report_the_global_models_loss_and_their_distance_from_it():
    torch.manual_seed(0)
    model = FedModel(nn.Identity(), nn.Linear(4, 3), 4)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    me = SimpleNamespace(
        model=model,
        scratch={},
        config={"eval_batch_size": 4},
        batches=lambda split, batch_size: (
            Batch(x[i : i + batch_size], y[i : i + batch_size], None)
            for i in range(0, 10, batch_size)
        ),
        task_loss=lambda b, out: F.cross_entropy(out["logits"], b.y),
    )
    with plugin_scope("qfedavg"):
        qfedavg.fedkit_round_start(me)
        with torch.no_grad():
            model.head.bias += 0.5
        report = qfedavg.fedkit_client_report(me)
    with torch.no_grad():
        hand = F.cross_entropy(model(x)["logits"] - 0.5, y).item()
    assert report[qfedavg.LOSS] == pytest.approx(hand, rel=1e-5)
    assert report[qfedavg.DISTANCE] == pytest.approx(3 * 0.25)


def test_refuses_adaptive_optimisers_unless_l_is_given():
    def check(optimizer, lipschitz=None):
        srv = server({}, q=1.0, lipschitz=lipschitz, config={"optimizer": optimizer})
        with plugin_scope("qfedavg"):
            return qfedavg.fedkit_check(srv)

    assert check("sgd") is None and check("adam", lipschitz=50.0) is None
    assert "optimizer=adam" in check("adam") and "qfedavg.lipschitz" in check("adamw")


@pytest.fixture(scope="module")
def local_run():
    return run(small(optimizer="sgd", lr=0.05), plugins={"fedlc": fedlc, "qfedavg": qfedavg})


def test_fedlc_composes_with_qfedavg(local_run):
    train = local_run.rounds[0]["train"]
    assert all(c["qfedavg.loss"] > 0 and c["qfedavg.sqdist"] > 0 for c in train.values())
    assert 0 <= local_run.final["global"]["bacc"] <= 1


@pytest.mark.slow
def test_fedlc_with_qfedavg_on_flower_gives_the_local_results(local_run):
    pytest.importorskip("flwr")
    config = small(optimizer="sgd", lr=0.05, engine="flower", flower={"backend": "thread"})
    flower = run(config, plugins={"fedlc": fedlc, "qfedavg": qfedavg})
    for scope in ("global", "clients_mean", "fairness"):
        for key, value in local_run.final[scope].items():
            assert flower.final[scope][key] == pytest.approx(value, abs=1e-6), (scope, key)
