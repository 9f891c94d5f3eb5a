"""Options and engine paths added for speed give the same results as before (issue 16)."""

import numpy as np
import pytest
import torch

from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.loading import load_task
from fedkit_core.testing import tiny


def test_fixed_normalizer_scales_to_the_given_statistics():
    cfg, _ = resolve_config(tiny(**{"task.mean": [0.5], "task.std": [0.5]}))
    data = load_task(cfg)
    assert data.normalizer.mean == (0.5,) * 3 and data.normalizer.std == (0.5,) * 3
    x = torch.tensor([0, 255], dtype=torch.uint8).view(2, 1, 1, 1).expand(2, 3, 1, 1)
    assert data.normalizer(x).flatten().tolist() == [-1.0] * 3 + [1.0] * 3


def test_without_fixed_statistics_the_normalizer_is_fitted():
    cfg, _ = resolve_config(tiny())
    assert load_task(cfg).normalizer.std != (0.5,) * 3


@pytest.mark.parametrize(
    "values, message",
    [
        ({"task.mean": [0.5]}, "go together"),
        ({"task.mean": [0.5, 0.5], "task.std": [0.5, 0.5]}, "need 1 or 3 values"),
        ({"task.mean": [0.5], "task.std": [0.0]}, "task.std must be all above 0"),
    ],
)
def test_fixed_normalizer_refuses_bad_values(values, message):
    with pytest.raises(FedkitError, match=message):
        cfg, _ = resolve_config(tiny(**values))
        load_task(cfg)


@pytest.mark.parametrize("seed", range(6))
def test_classification_metrics_are_bitwise_scikit_learns(seed):
    from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

    from fedkit_core.metrics.classification import classification_metrics

    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(5, 400)), int(rng.integers(3, 9))
    labels = rng.integers(0, k - (seed % 2), n)  # odd seeds: a class never in the labels
    probs = rng.dirichlet(np.ones(k), n).astype(np.float32)
    if seed % 3 == 0:  # many tied scores
        probs = np.round(probs, 1)
    pred = probs.argmax(axis=1)
    out = classification_metrics(probs, labels)
    assert out["bacc"] == balanced_accuracy_score(labels, pred)
    assert out["f1_macro"] == f1_score(labels, pred, average="macro", zero_division=0)
    aucs = [roc_auc_score(labels == c, probs[:, c]) for c in np.unique(labels)]
    assert out["bauc"] == float(np.mean(aucs))


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_metrics_of_a_few_samples_are_scikit_learns(n):
    """A thousand clients score a few samples each: bitwise scikit-learn's scores there too,
    shot-group accuracies included (mean per-class recall)."""
    from sklearn.metrics import balanced_accuracy_score, f1_score, recall_score

    from fedkit_core.metrics.classification import classification_metrics

    groups = {"head": [0, 1], "medium": [2], "tail": [3, 4]}
    for seed in range(40):
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 5, n)
        probs = rng.dirichlet(np.ones(5), n).astype(np.float32)
        pred = probs.argmax(axis=1)
        out = classification_metrics(probs, labels, groups)
        assert out["acc"] == float((pred == labels).mean())
        assert out["bacc"] == balanced_accuracy_score(labels, pred)
        assert out["f1_macro"] == f1_score(labels, pred, average="macro", zero_division=0)
        present = np.unique(labels)
        recall = recall_score(labels, pred, labels=present, average=None, zero_division=0)
        for group, classes in groups.items():
            got = [r for c, r in zip(present, recall) if c in classes]
            assert out.get(f"{group}_acc") == (float(np.mean(got)) if got else None)


def _without_times(results):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in results.rounds]


def test_clients_sharing_one_model_give_the_results_of_a_model_each(monkeypatch):
    from fedkit_core import run
    from fedkit_core.engines import local

    config = tiny(clients=6, sample_fraction=0.5, **{"partition.kind": "iid"})
    built = []
    share = local.shared_model
    monkeypatch.setattr(local, "shared_model", lambda *a: built.append(share(*a)) or built[-1])
    shared = run(config)
    assert built and built[0] is not None  # the clients did share one model
    monkeypatch.setattr(local, "shared_model", lambda *a: None)
    eager = run(config)
    assert _without_times(shared) == _without_times(eager)


def test_plugins_or_kept_optimizer_state_keep_a_model_per_client():
    from fedkit_core.engines.local import shared_model
    from fedkit_core.engines.server import Server
    from fedkit_core.federation import prepare

    for config, plugins in ((tiny(keep_optimizer_state=True), None), (tiny(), {"x": object()})):
        cfg, plugin_set = resolve_config(config, plugins)
        fed = prepare(cfg, plugin_set)
        server = Server(cfg, plugin_set, fed.task, fed.device)
        assert shared_model(server, plugin_set) is None
