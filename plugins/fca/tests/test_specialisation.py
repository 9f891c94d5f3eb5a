"""The two specialisation protocols: the paper's (global feature extractor + personalised
head) and the authors' code's (the client's locally trained model before aggregation, with its
federated head). Same training, same generalisation; only the model that scores each client
differs, and each is recomputed here from the weights it is defined by."""

import fedkit_fca.plugin as fca
import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score

from fedkit_core import hookimpl, run
from fedkit_core.plugin import ClientContext
from fedkit_core.testing import party_model, prepare, resolve_config, tiny

SITES = ("site0", "site1", "site2")


class Spy:
    """Records each client's model right after local training and the aggregated model."""

    def __init__(self):
        self.local = {}  # client -> shared state after its last local training
        self.private = {}  # client -> private state after it
        self.global_state = None

    @hookimpl
    def fedkit_client_report(self, client):
        self.local[client.id] = client.model.shared_state()
        self.private[client.id] = client.model.private_state()

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        return None  # the built-in FedAvg


class GlobalSpy:
    """Records the global state every client receives for evaluation."""

    @hookimpl
    def fedkit_eval_views(self, client):
        self.received = client.model.shared_state()


def config(protocol):
    return tiny(loss="bsm", rounds=2, fca={"specialisation": protocol})


@pytest.fixture(scope="module")
def runs():
    out = {}
    for protocol in (fca.PAPER, fca.AUTHORS_CODE):
        spy, seen = Spy(), GlobalSpy()
        results = run(config(protocol), plugins={"fca": fca, "spy": spy, "seen": seen})
        out[protocol] = (results, spy, seen)
    return out


def client_scores(protocol, state_of, output):
    """bACC per client of ``output`` of a model with the shared weights ``state_of(cid)``."""
    cfg, plugin_set = resolve_config(config(protocol), {"fca": fca})
    fed = prepare(cfg, plugin_set)
    scores = {}
    for cid, data in fed.clients.items():
        ctx = ClientContext(fed.task, cfg, torch.device("cpu"), client_id=cid, info=data.info())
        model = party_model(plugin_set, ctx)
        shared, private = state_of(cid)
        model.load_shared(shared)
        model.load_private(private)
        model.eval()
        test = data["test"]
        with torch.no_grad():
            probs = model(data.normalizer(test.images))[output]
        scores[cid] = balanced_accuracy_score(test.targets.numpy(), probs.argmax(1).numpy())
    return scores


def test_both_protocols_train_the_same_models_and_generalise_alike(runs):
    (paper, paper_spy, _), (authors, authors_spy, _) = runs[fca.PAPER], runs[fca.AUTHORS_CODE]
    assert paper.final["global"] == authors.final["global"]
    assert paper.final["views"]["personal"] == authors.final["views"]["personal"]
    for cid in SITES:
        for key, value in paper_spy.local[cid].items():
            assert torch.equal(value, authors_spy.local[cid][key])


def test_paper_scores_clients_with_global_features_and_personal_head(runs):
    results, spy, seen = runs[fca.PAPER]
    assert results["config"]["fca"]["specialisation"] == fca.PAPER
    want = client_scores(fca.PAPER, lambda cid: (seen.received, spy.private[cid]), fca.PERSONAL)
    for cid in SITES:
        assert results.final["clients"][cid]["bacc"] == pytest.approx(want[cid], abs=1e-9)
    assert results.final["views"]["personal"]["clients"] == results.final["clients"]


def test_authors_code_scores_clients_with_the_local_model_before_aggregation(runs):
    results, spy, _ = runs[fca.AUTHORS_CODE]

    def local(cid):  # the local model in a plain FCA model (its snapshot extra left out)
        personal = {k: v for k, v in spy.private[cid].items() if fca.LOCAL not in k}
        return spy.local[cid], personal

    want = client_scores(fca.PAPER, local, "logits")
    for cid in SITES:
        assert results.final["clients"][cid]["bacc"] == pytest.approx(want[cid], abs=1e-9)
    assert results.final["views"]["local"]["clients"] == results.final["clients"]
    # the paper's specialisation is still reported beside it, and it differs
    paper = results.final["views"]["personal"]["clients"]
    assert any(abs(paper[c]["bauc"] - results.final["clients"][c]["bauc"]) > 1e-4 for c in SITES), (
        "the two protocols score alike: the test cannot tell them apart"
    )
    spec = np.mean([results.final["clients"][c]["bacc"] for c in SITES])
    gs = (results.final["global"]["bacc"] + spec) / 2
    assert results.final["summary"]["fca.gs_bacc"] == pytest.approx(gs, abs=1e-9)


def test_the_snapshot_is_private_and_never_trained(runs):
    _, spy, _ = runs[fca.AUTHORS_CODE]
    for cid in SITES:
        assert not [k for k in spy.local[cid] if k.startswith("extras.")]
        assert any(k.startswith(f"extras.{fca.LOCAL}.") for k in spy.private[cid])
