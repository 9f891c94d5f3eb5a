"""An FCA federation end to end, on one tiny run.

The personalised head stays on its client: never uploaded, never in the global checkpoint,
kept across rounds and across an interrupted-and-resumed run; the shared rest is FedAvg by
training size; evaluation is the paper's generalisation / specialisation, recomputed here
independently from the checkpointed models."""

from types import SimpleNamespace

import fedkit_fca.plugin as fca
import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

from fedkit_core import hookimpl, resume, run
from fedkit_core.plugin import ClientContext
from fedkit_core.testing import (
    ClientCheckpoints,
    ClientFailure,
    ServerCheckpoints,
    party_model,
    prepare,
    resolve_config,
    tiny,
)

PREFIX = f"extras.{fca.PERSONAL}."


class Spy:
    """Records what the server receives and the personal head around each local round."""

    def __init__(self, crash_in_round=None):
        self.uploads = {}  # round -> {client: {key: tensor}}
        self.num_examples = {}  # round -> {client: n}
        self.at_start = {}  # (round, client) -> personal state
        self.at_end = {}
        self.crash_in_round = crash_in_round

    @staticmethod
    def personal(client):
        return {k: v.clone() for k, v in client.model.private_state().items()}

    @hookimpl
    def fedkit_round_start(self, client):
        if client.round == self.crash_in_round:
            raise RuntimeError("simulated crash")
        self.at_start[client.round, client.id] = self.personal(client)

    @hookimpl
    def fedkit_client_report(self, client):
        self.at_end[client.round, client.id] = self.personal(client)

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        self.uploads[server.round] = {u.client_id: dict(u.arrays) for u in updates}
        self.num_examples[server.round] = {u.client_id: u.num_examples for u in updates}
        return None  # fall back to the built-in FedAvg


def config(**overrides):
    return tiny(loss="bsm", rounds=2, checkpoint=True, **overrides)


def checkpoint(out):
    """(server snapshot, {client id: client state}) of the last committed round."""
    directory = out / "checkpoint"
    server = ServerCheckpoints(directory).load()
    done = server["next_round"] - 1
    clients = {
        cid: ClientCheckpoints.of(directory, cid).load(done)["client"]
        for cid in ("site0", "site1", "site2")
    }
    return server, clients


@pytest.fixture(scope="module")
def spied(tmp_path_factory):
    out = tmp_path_factory.mktemp("fca") / "run"
    spy = Spy()
    results = run(config(), plugins={"fca": fca, "spy": spy}, out=out)
    return spy, results, out


def test_personal_head_is_never_uploaded(spied):
    spy, _, out = spied
    assert len(spy.uploads) == 2
    for per_client in spy.uploads.values():
        for arrays in per_client.values():
            assert arrays, "the clients uploaded nothing"
            assert not [k for k in arrays if k.startswith("extras.")]
            assert {"head.weight", "head.bias"} <= set(arrays)  # the federated head is shared


def test_personal_head_is_not_in_the_global_checkpoint_but_in_each_clients(spied):
    _, _, out = spied
    server, clients = checkpoint(out)
    assert not [k for k in server["global_state"] if fca.PERSONAL in k]
    assert "head.weight" in server["global_state"]
    for state in clients.values():
        assert set(state["private"]) == {PREFIX + "weight", PREFIX + "bias"}
    heads = [state["private"][PREFIX + "weight"] for state in clients.values()]
    assert not torch.equal(heads[0], heads[1]), "clients share one personal head"
    # nothing about the personal head leaks into the written results either
    assert fca.PERSONAL not in (out / "results.json").read_text()


def test_personal_head_persists_and_trains_across_rounds(spied):
    spy, _, _ = spied
    for cid in ("site0", "site1", "site2"):
        start, end, following = spy.at_start[1, cid], spy.at_end[1, cid], spy.at_start[2, cid]
        assert not torch.equal(start[PREFIX + "weight"], end[PREFIX + "weight"])
        for key in start:  # round 2 starts from the head trained in round 1
            assert torch.equal(end[key], following[key])


def test_global_model_is_fedavg_by_training_size(spied):
    spy, _, out = spied
    server, _ = checkpoint(out)
    uploads, sizes = spy.uploads[2], spy.num_examples[2]
    weights = np.array([sizes[c] for c in uploads], dtype=np.float64)
    for key in ("head.weight", "backbone.features.0.0.weight"):
        stack = np.stack([uploads[c][key].double().numpy() for c in uploads])
        want = np.tensordot(weights / weights.sum(), stack, axes=1)
        np.testing.assert_allclose(server["global_state"][key].numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_resume_after_a_crash_gives_the_uninterrupted_run(spied, tmp_path):
    _, whole, whole_out = spied
    out = tmp_path / "crashed"
    with pytest.raises(ClientFailure):
        run(config(), plugins={"fca": fca, "spy": Spy(crash_in_round=2)}, out=out)
    assert checkpoint(out)[0]["next_round"] == 2
    resumed = resume(out, plugins={"fca": fca, "spy": Spy()})
    for scope in ("global", "clients", "summary", "views"):
        assert resumed.final[scope] == whole.final[scope]
    for cid, state in checkpoint(out)[1].items():
        for key, value in state["private"].items():
            assert torch.equal(value, checkpoint(whole_out)[1][cid]["private"][key])


def test_segmentation_tasks_are_refused_with_a_clear_message():
    server = SimpleNamespace(task=SimpleNamespace(kind="segmentation", name="prostate"))
    assert "fca needs a classification task" in fca.fedkit_check(server=server)


def bacc_bauc(probs, labels):
    """The paper's metrics, straight from scikit-learn (bAUC over the classes present)."""
    present = [c for c in np.unique(labels) if 0 < (labels == c).sum() < len(labels)]
    bauc = np.mean([roc_auc_score(labels == c, probs[:, c]) for c in present])
    return balanced_accuracy_score(labels, probs.argmax(1)), bauc


def predictions(out):
    """Per client: test labels and the softmax of both heads of its final model (the global
    shared weights plus its own personalised head), rebuilt from the checkpoint."""
    cfg, plugin_set = resolve_config(config(), {"fca": fca, "spy": Spy()})
    fed = prepare(cfg, plugin_set)
    server, clients = checkpoint(out)
    result = {}
    for cid, data in fed.clients.items():
        ctx = ClientContext(fed.task, cfg, torch.device("cpu"), client_id=cid, info=data.info())
        model = party_model(plugin_set, ctx)
        model.load_shared(server["global_state"])
        model.load_private(clients[cid]["private"])
        model.eval()
        test = data["test"]
        with torch.no_grad():
            outputs = model(data.normalizer(test.images))
        result[cid] = (
            test.targets.numpy(),
            torch.softmax(outputs["logits"], 1).numpy(),
            torch.softmax(outputs[fca.PERSONAL], 1).numpy(),
        )
    return result


def test_generalisation_and_specialisation_as_the_paper_defines_them(spied):
    _, results, out = spied
    preds = predictions(out)
    final = results.final
    # generalisation: the global model's federated head on the pooled test set
    labels = np.concatenate([p[0] for p in preds.values()])
    federated = np.concatenate([p[1] for p in preds.values()])
    g_bacc, g_bauc = bacc_bauc(federated, labels)
    assert final["global"]["bacc"] == pytest.approx(g_bacc, abs=1e-9)
    assert final["global"]["bauc"] == pytest.approx(g_bauc, abs=1e-6)
    # ... which is the pooled score of the view "global" (the received global model)
    assert final["views"]["global"]["global"] == final["global"]
    # specialisation: each client's personalised head on its own test set (the view
    # "personal", which also scores the clients in the per-client scopes)
    assert final["views"]["personal"]["clients"] == final["clients"]
    differs = False
    for cid, (y, fed_probs, personal_probs) in preds.items():
        s_bacc, s_bauc = bacc_bauc(personal_probs, y)
        assert final["clients"][cid]["bacc"] == pytest.approx(s_bacc, abs=1e-9)
        assert final["clients"][cid]["bauc"] == pytest.approx(s_bauc, abs=1e-6)
        differs |= abs(bacc_bauc(fed_probs, y)[1] - s_bauc) > 1e-4
    assert differs, "the personalised and federated heads score alike: the test cannot tell"
    # their mean, the paper's headline
    for m in ("bacc", "bauc"):
        spec = np.mean([final["clients"][c][m] for c in preds])
        assert final["clients_mean"][m] == pytest.approx(spec, abs=1e-9)
        gs = (final["global"][m] + spec) / 2
        assert final["summary"][f"fca.gs_{m}"] == pytest.approx(gs, abs=1e-9)
