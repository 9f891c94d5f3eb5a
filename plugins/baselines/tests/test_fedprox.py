"""FedProx's proximal term against a hand computation (shared parameters only), FedProx
with q-FedAvg on a tiny segmentation task, and FedProx under sample-level DP-SGD (its
declared parameter term added after the noise)."""

from types import SimpleNamespace

import fedkit_baselines.fedprox as fedprox
import fedkit_baselines.qfedavg as qfedavg
import pytest
import torch
from torch import nn

from fedkit_core import run
from fedkit_core.plugin import FedModel, plugin_scope
from fedkit_core.testing import BUNDLED, REPO_ROOT, ServerCheckpoints, tiny, tiny_seg


def test_proximal_term_matches_hand_computation_on_shared_parameters():
    model = FedModel(nn.Linear(2, 2), nn.Linear(2, 3), 2)
    model.mark_private("head")
    me = SimpleNamespace(model=model, options=lambda: {"mu": 0.4}, scratch={})
    with plugin_scope("fedprox"):
        fedprox.fedkit_round_start(me)
        with torch.no_grad():
            model.backbone.weight += 0.5  # 4 entries
            model.backbone.bias -= 1.0  # 2 entries
            model.head.weight += 7.0  # private: no global value, no pull
        term = fedprox.fedkit_loss_terms(me, None, None)["fedprox.proximal"]
    assert term.item() == pytest.approx(0.5 * 0.4 * (4 * 0.5**2 + 2 * 1.0**2))
    term.backward()
    assert model.backbone.bias.grad.tolist() == pytest.approx([-0.4, -0.4])  # mu * (w - w_g)
    assert model.head.weight.grad is None


def test_fedprox_and_qfedavg_run_on_segmentation():
    results = run(
        tiny_seg(
            rounds=1,
            task={"train_per_site": 4, "image_size": 16},
            unet_channels=[4, 8],
            batch_size=2,
            optimizer="sgd",
            fedprox={"mu": 0.1},
            qfedavg={"q": 2.0},
        ),
        plugins={"fedprox": fedprox, "qfedavg": qfedavg},
    )
    train = next(iter(results.rounds[0]["train"].values()))
    assert train["loss.fedprox.proximal"] > 0 and train["qfedavg.loss"] > 0
    assert 0 <= results.final["global"]["dice"] <= 1


def entry_points(folder: str) -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO_ROOT / folder / "pyproject.toml").read_text())["project"]
    return project["entry-points"]["fedkit.plugins"]


def test_the_name_fedprox_is_the_baselines_and_the_example_has_its_own():
    baselines = entry_points("plugins/baselines")
    assert baselines["fedprox"] == "fedkit_baselines.fedprox"
    assert list(baselines) == sorted(baselines)
    assert entry_points("examples/plugin-fedprox") == {"fedprox-example": "fedkit_fedprox"}
    # `fedkit run --plugin NAME` without the package installed names the folder to install
    assert {name: BUNDLED[name] for name in baselines} == dict.fromkeys(
        baselines, "plugins/baselines"
    )
    assert BUNDLED["fedprox-example"] == "examples/plugin-fedprox"


def _dp_sgd(tmp_path, mode: str, mu: float | None) -> tuple[dict[str, torch.Tensor], float]:
    """The global model and epsilon after a round of DP-SGD (``mode`` clipping, the noise
    drawn from the seed: tests only), FedAvg or FedProx with ``mu``."""
    dp = {"level": "sample", "grad_sample": mode, "reproducible_noise": True}
    config = tiny(rounds=1, checkpoint=True, dp=dp, task={"sites": 2, "head_samples": 12})
    plugins = None
    if mu is not None:
        config, plugins = {**config, "fedprox": {"mu": mu}}, {"fedprox": fedprox}
    out = tmp_path / f"{mode}-{mu}"
    results = run(config, out=out, plugins=plugins)
    assert results.final["privacy"]["grad_sample"] == mode
    state = ServerCheckpoints(out / "checkpoint").load()["global_state"]
    return state, results.final["privacy"]["epsilon"]


@pytest.mark.slow  # three runs (the mechanism's one-step tests are in tests/, not slow)
@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_fedprox_under_dp_sgd_is_fedavg_at_mu_0_and_pulls_at_mu_above(tmp_path, mode):
    """FedProx trains under ``dp.level=sample`` in both clipping modes: at mu 0 exactly as
    FedAvg; at mu 1 its proximal gradient changes the update (it was dropped or refused
    before); the epsilon is FedAvg's (the term is post-processing)."""
    fedavg, eps = _dp_sgd(tmp_path, mode, None)
    same, eps_same = _dp_sgd(tmp_path, mode, 0.0)
    pulled, eps_pulled = _dp_sgd(tmp_path, mode, 1.0)
    assert eps == eps_same == eps_pulled > 0
    assert same.keys() == fedavg.keys()
    assert all(torch.equal(same[k], fedavg[k]) for k in fedavg)
    gap = max(float((pulled[k].float() - fedavg[k].float()).abs().max()) for k in fedavg)
    assert gap > 1e-6
