"""Sample-level DP (DP-SGD): ghost clipping and per-sample gradients clip each sample's
gradient to the same bound as an explicit per-sample computation, add the same noise, and
runs stay deterministic per seed; ``dp.grad_sample`` falls back or refuses with the reason
when a plugin's loss cannot be split per sample."""

import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fedkit_core import run
from fedkit_core.builtins.losses import fedkit_task_loss, task_loss_per_sample
from fedkit_core.engines.checkpoint import ServerCheckpoints
from fedkit_core.errors import FedkitError
from fedkit_core.plugin import hookimpl
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.privacy.sample_level import PerSampleClipping
from fedkit_core.testing import tiny, tiny_pretrained

BATCH = 8


def _model() -> nn.Module:
    """Conv (per-sample gradient of that layer under ghost), group norm, linear layers
    (ghost norms)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.GroupNorm(2, 4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 16),
        nn.ReLU(),
        nn.Linear(16, 3),
    )


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 1, 6, 6, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def _per_sample_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list:
    """Each sample's gradient, one backward pass per sample."""
    out = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def _clipping(
    model: torch.nn.Module, mode: str, clip: float = 1.0, sigma: float = 0.0, seed: int = 7
) -> PerSampleClipping:
    """``mode``'s DP-SGD step around ``model`` (SGD, lr 1), noise from generator ``seed``."""
    return PerSampleClipping(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        mode,
        clip=clip,
        sigma=sigma,
        expected_batch_size=BATCH,
        generator=torch.Generator().manual_seed(seed),
    )


def _step(mode: str, clip: float, sigma: float) -> list[torch.Tensor]:
    """The parameters after one DP-SGD step (SGD, lr 1) of ``mode``."""
    model = _model()
    x, y = _data()
    dp = _clipping(model, mode, clip, sigma)
    dp.optimizer.zero_grad(set_to_none=True)
    outputs = model(x)
    dp.backward(F.cross_entropy(outputs, y), lambda: F.cross_entropy(outputs, y, reduction="none"))
    dp.optimizer.step()
    dp.close()
    assert not any(
        hasattr(p, "grad_sample") or hasattr(p, "_norm_sample") for p in model.parameters()
    )
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_one_step_sums_each_sample_gradient_clipped_to_the_bound(mode):
    model = _model()
    x, y = _data()
    grads = _per_sample_gradients(model, x, y)
    norms = torch.stack([torch.cat([g.flatten() for g in gs]).norm() for gs in grads])
    clip = float(norms.median())  # about half the samples are clipped
    assert (norms > clip * 1.01).sum() >= 2 and (norms < clip * 0.99).sum() >= 2
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    expected = [
        p.detach() - sum(f * gs[k] for f, gs in zip(factors, grads)) / BATCH
        for k, p in enumerate(model.parameters())
    ]
    for got, want in zip(_step(mode, clip, sigma=0.0), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_ghost_and_hooks_add_the_same_noise():
    """Same bound, same noise std from the same generator: one step agrees to float
    tolerance (the noise dominates the update at sigma 5)."""
    ghost, hooks = _step("ghost", 0.5, sigma=5.0), _step("hooks", 0.5, sigma=5.0)
    plain = _step("ghost", 0.5, sigma=0.0)
    for g, h, p in zip(ghost, hooks, plain):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-5)
        assert (g - p).abs().max() > 0.05  # noise was added


def test_ghost_empty_step_adds_noise_only():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    dp = _clipping(model, "ghost", sigma=1.0)
    dp.empty_step()
    noise = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert 0.5 < float(noise.std() * BATCH) < 1.5  # std sigma * C / expected batch size


@pytest.mark.parametrize("kind", ["ce", "bsm", "dice", "dice_ce"])
def test_per_sample_task_loss_averages_to_the_task_loss(kind):
    if kind.startswith("dice"):
        pytest.importorskip("monai")
    g = torch.Generator().manual_seed(0)
    if kind.startswith("dice"):
        logits, y = (
            torch.randn(5, 3, 8, 8, generator=g),
            torch.randint(0, 3, (5, 8, 8), generator=g),
        )
    else:
        logits, y = torch.randn(5, 3, generator=g), torch.randint(0, 3, (5,), generator=g)
    client = types.SimpleNamespace(
        config={"loss": kind}, log_prior=lambda: torch.log(torch.tensor([0.6, 0.3, 0.1]))
    )
    batch, outputs = types.SimpleNamespace(y=y), {"logits": logits}
    per_sample = task_loss_per_sample(client, batch, outputs)
    assert per_sample.shape == (5,)
    torch.testing.assert_close(per_sample.mean(), fedkit_task_loss(client, batch, outputs))


@pytest.mark.slow
def test_ghost_runs_are_deterministic_per_seed_and_recorded():
    config = tiny(
        rounds=2, dp={"level": "sample", "grad_sample": "ghost", "reproducible_noise": True}
    )
    first, second = run(config), run(config)
    other = run({**config, "seed": 1})
    assert first.final["privacy"]["grad_sample"] == "ghost"
    assert first.final["clients"] == second.final["clients"]
    assert first.final["privacy"]["epsilon"] == second.final["privacy"]["epsilon"] > 0
    assert first.final["clients"] != other.final["clients"]


class _Terms:
    """A throwaway plugin that adds a loss term (not split per sample)."""

    @staticmethod
    @hookimpl
    def fedkit_loss_terms(client, batch, outputs):
        return {"terms.l2": 1e-3 * outputs["logits"].pow(2).mean()}


def test_plugin_loss_terms_fall_back_to_hooks_or_are_refused_under_ghost():
    with pytest.raises(FedkitError, match="'terms'.*dp.grad_sample=hooks"):
        run(
            tiny(rounds=1, dp={"level": "sample", "grad_sample": "ghost"}),
            plugins={"terms": _Terms},
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run(tiny(rounds=1, dp={"level": "sample"}), plugins={"terms": _Terms})
    assert results.final["privacy"]["grad_sample"] == "hooks"
    assert any("'terms'" in str(w.message) and "hooks" in str(w.message) for w in caught)


class _OnParameters:
    """A throwaway plugin whose loss term acts on the parameters directly, as FedProx's."""

    @staticmethod
    @hookimpl
    def fedkit_loss_terms(client, batch, outputs):
        return {"onparams.l2": sum(p.pow(2).sum() for p in client.model.parameters())}


def test_clipping_reports_a_term_that_bypasses_the_per_sample_gradients():
    """Under hooks, ``.grad`` equals the per-sample gradients' mean for a loss of the
    outputs, even one that mixes samples; a term on the weights shows as a gap."""
    model = _model()
    x, y = _data()
    dp = _clipping(model, "hooks", seed=0)
    logits = dp.module(x)
    mixed = F.cross_entropy(logits, y) + logits.softmax(-1).mean(0).pow(2).sum()
    dp.backward(mixed)
    assert dp.bypassed(1e-4) == {}
    dp.optimizer.zero_grad(set_to_none=True)
    weight = model[-1].weight
    dp.backward(F.cross_entropy(dp.module(x), y) + 0.5 * weight.pow(2).sum())
    gaps = dp.bypassed(1e-4)
    assert "6.weight" in gaps and "6.bias" not in gaps and gaps["6.weight"] > 1e-2
    dp.close()


@pytest.mark.parametrize("plugin", ["fedprox-example", "onparams"])
def test_a_loss_term_on_the_parameters_is_refused_under_sample_level_dp(plugin):
    """An undeclared term on the parameters (the example FedProx, mu > 0, declares none)
    would be dropped by DP-SGD: its gradient misses the per-sample gradients. The run stops
    naming the plugin (its gradient is zero on a round's first step, so a later step
    catches it)."""
    config = tiny(rounds=1, plugins=[] if plugin == "onparams" else [plugin])
    if plugin != "onparams":
        config[plugin] = {"mu": 0.01}
    extra = {"onparams": _OnParameters} if plugin == "onparams" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FedkitError, match=rf"the loss of plugin '{plugin}'.*round 1: "):
            run({**config, "dp": {"level": "sample"}}, plugins=extra)


def test_output_terms_and_plain_dp_sgd_pass_the_bypass_check(monkeypatch):
    """A term on the outputs (``_Terms``) and the built-in loss are checked and pass."""
    from fedkit_core.privacy.sample_level import DPSGD

    checked = []
    real = DPSGD.check_captured
    monkeypatch.setattr(DPSGD, "check_captured", lambda self: checked.append(1) or real(self))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = run(tiny(rounds=1, dp={"level": "sample"}), plugins={"terms": _Terms})
        assert results.final["privacy"]["grad_sample"] == "hooks" and checked
        checked.clear()
        plain = run(tiny(rounds=1, dp={"level": "sample", "grad_sample": "hooks"}))
    assert plain.final["privacy"]["epsilon"] > 0 and checked


#: EfficientNet-Lite0's trunk: every batch norm (timm's fused BatchNormAct2d) is in it
TRUNK = [
    "backbone.net.conv_stem",
    "backbone.net.bn1",
    "backbone.net.blocks",
    "backbone.net.conv_head",
    "backbone.net.bn2",
]


@pytest.mark.slow
def test_a_frozen_pretrained_trunk_with_batch_norm_trains_under_dp_sgd(tmp_path):
    """``freeze`` applies before the DP-SGD model check: a frozen batch norm (eval mode,
    running statistics kept) mixes no samples, so only the trainable layers are checked;
    the same model unfrozen is still refused, naming its batch norm."""
    dp = {"level": "sample", "noise_multiplier": 1.0}
    config = tiny_pretrained(tmp_path, dp=dp, freeze=TRUNK, checkpoint=True, lr=1e-3)
    results = run(config, out=tmp_path / "frozen")
    assert results.final["privacy"]["epsilon"] > 0
    state = ServerCheckpoints(tmp_path / "frozen" / "checkpoint").load()["global_state"]
    assert "backbone.net.bn1.running_mean" in state  # kept, not replaced by group norm
    with pytest.raises(FedkitError, match="BatchNormAct2d"):
        run({**config, "freeze": []}, out=tmp_path / "unfrozen")


def _pull(model: nn.Module) -> torch.Tensor:
    """A term of the parameters alone: ``sum ||w - 0.1||^2`` (nonzero gradient at once)."""
    return sum((p - 0.1).pow(2).sum() for p in model.parameters())


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_a_parameter_terms_gradient_is_added_after_clipping_and_noise(mode):
    """Without clipping or noise the step is SGD on the whole loss (computed by hand);
    with both, the term's gradient comes on top of the same privatised step, neither
    clipped nor noised, and the per-sample gradients stay those of the data loss."""
    x, y = _data()
    model = _model()
    F.cross_entropy(model(x), y).add(_pull(model)).backward()
    expected = [(p - p.grad).detach() for p in model.parameters()]

    def step(clip: float, sigma: float, term: bool) -> list[torch.Tensor]:
        model = _model()
        dp = _clipping(model, mode, clip=clip, sigma=sigma)
        dp.optimizer.zero_grad(set_to_none=True)
        outputs = model(x)
        dp.apart(_pull(model) if term else None)
        loss = F.cross_entropy(outputs, y)
        dp.backward(loss, lambda: F.cross_entropy(outputs, y, reduction="none"))
        if mode == "hooks":
            assert dp.bypassed(1e-4) == {}
        dp.optimizer.step()
        dp.close()
        return [p.detach() for p in model.parameters()]

    for got, want in zip(step(1e6, 0.0, True), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    model = _model()
    pull = torch.autograd.grad(_pull(model), list(model.parameters()))
    noised, plain = step(0.5, 5.0, True), step(0.5, 5.0, False)
    for with_term, without, grad in zip(noised, plain, pull):
        torch.testing.assert_close(with_term, without - grad, rtol=1e-4, atol=1e-5)


def test_the_empty_step_drops_a_kept_parameter_gradient():
    model = _model()
    dp = _clipping(model, "ghost")
    dp.apart(_pull(model))
    assert dp.extra
    dp.empty_step()
    assert dp.extra == {}


class _Declared:
    """A throwaway plugin with a declared parameter term (a pull of the weights to 0.1)."""

    fedkit_parameter_terms = ("declared.pull",)

    @staticmethod
    @hookimpl
    def fedkit_loss_terms(client, batch, outputs):
        return {"declared.pull": 1e-3 * _pull(client.model)}


class _FromOutputs:
    """Declares a term that is computed from the outputs: it depends on the batch."""

    fedkit_parameter_terms = ("leaky.outputs",)

    @staticmethod
    @hookimpl
    def fedkit_loss_terms(client, batch, outputs):
        return {"leaky.outputs": 1e-3 * outputs["logits"].pow(2).mean()}


class _SecondPass:
    """Declares a term from a second forward pass of the batch through the model."""

    fedkit_parameter_terms = ("leaky.pass",)

    @staticmethod
    @hookimpl
    def fedkit_loss_terms(client, batch, outputs):
        again = client.forward(client.model, batch.x)["logits"]
        return {"leaky.pass": 1e-3 * again.pow(2).mean()}


class _Mislabelled:
    """Declares a name it does not return, and returns an undeclared term on the weights."""

    fedkit_parameter_terms = ("mislabelled.other",)

    @staticmethod
    @hookimpl
    def fedkit_loss_terms(client, batch, outputs):
        return {"mislabelled.l2": sum(p.pow(2).sum() for p in client.model.parameters())}


def test_a_declared_parameter_term_trains_under_ghost_clipping_without_a_fallback():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run(tiny(rounds=1, dp={"level": "sample"}), plugins={"declared": _Declared})
    assert not any("grad_sample=auto" in str(w.message) for w in caught)  # no fallback
    assert results.final["privacy"]["grad_sample"] == "ghost"
    assert results.final["privacy"]["epsilon"] > 0


@pytest.mark.parametrize(
    ("plugin", "mode", "reached"),
    [
        (_FromOutputs, "ghost", "the model's outputs"),
        (_FromOutputs, "hooks", "the model's outputs"),
        (_SecondPass, "hooks", "a layer of the model"),
    ],
)
def test_a_declared_term_that_depends_on_the_batch_is_refused(plugin, mode, reached):
    """(Under ghost, Opacus itself refuses a second forward pass, before any loss.)"""
    config = tiny(rounds=1, dp={"level": "sample", "grad_sample": mode})
    with pytest.raises(FedkitError, match=rf"plugin 'leaky' declares .* from {reached}, so"):
        run(config, plugins={"leaky": plugin})


def test_an_undeclared_term_of_a_declaring_plugin_is_refused():
    """Under hooks the bypass check refuses it, naming the declared name never returned;
    ghost (auto's choice for a declaring plugin) refuses any undeclared term."""
    config = tiny(rounds=1, dp={"level": "sample", "grad_sample": "hooks"})
    with pytest.raises(FedkitError, match="proximal term.*not returned: 'mislabelled.other'"):
        run(config, plugins={"mislabelled": _Mislabelled})
    with pytest.raises(FedkitError, match="'mislabelled.l2' of plugin 'mislabelled' are not"):
        run(tiny(rounds=1, dp={"level": "sample"}), plugins={"mislabelled": _Mislabelled})


@pytest.mark.parametrize("declared", ["declared.pull", ("task",), (1,)])
def test_a_malformed_parameter_term_declaration_is_refused(declared):
    plugin = type("Bad", (_Declared,), {"fedkit_parameter_terms": declared})
    with pytest.raises(FedkitError, match="plugin 'bad': fedkit_parameter_terms"):
        PluginSet(extra={"bad": plugin})
