"""FedETF: the simplex ETF's geometry, the same fixed ETF on every party, personal fine-tuning."""

import pytest
import torch
from fedkit_baselines import fedetf

from fedkit_core import FedkitError, run
from fedkit_core.testing import tiny, tiny_seg


@pytest.mark.parametrize(("dim", "classes"), [(5, 5), (16, 4), (64, 10)])
def test_etf_columns_are_unit_and_equiangular(dim, classes):
    etf = fedetf.simplex_etf(dim, classes, torch.Generator().manual_seed(0)).double()
    assert etf.shape == (dim, classes)
    assert torch.allclose(etf.norm(dim=0), torch.ones(classes, dtype=torch.float64), atol=1e-6)
    cosine = etf.T @ etf
    off = cosine[~torch.eye(classes, dtype=torch.bool)]
    assert torch.allclose(off, torch.full_like(off, -1.0 / (classes - 1)), atol=1e-6)
    # a simplex: the prototypes sum to zero
    assert torch.allclose(etf.sum(dim=1), torch.zeros(dim, dtype=torch.float64), atol=1e-6)


def test_etf_needs_room():
    with pytest.raises(FedkitError, match="simplex ETF"):
        fedetf.simplex_etf(3, 5, torch.Generator())


@pytest.mark.slow
def test_runs_with_a_fixed_etf_that_is_never_sent_and_personalises():
    config = tiny(rounds=2, fedetf={"cycles": 1, "epochs": 1})
    results = run(config, plugins={"fedetf": fedetf})
    assert set(results.final["views"]) == {"global", "personal"}
    assert "bacc" in results.final["global"] and results.final["clients"]
    again = run(config, plugins={"fedetf": fedetf})
    assert again.final["clients"] == results.final["clients"]


def test_the_head_is_the_etf_head_and_only_projection_and_temperature_are_state():
    from types import SimpleNamespace

    from torch import nn

    from fedkit_core.plugin import FedModel, plugin_scope

    def build(client_id):
        model = FedModel(nn.Linear(3, 8), nn.Linear(8, 4), 8)
        ctx = SimpleNamespace(
            client_id=client_id,
            options=lambda: {"dim": None, "beta": 10.0},
            task=SimpleNamespace(num_classes=4),
            config={"seed": 3},
        )
        with plugin_scope("fedetf"):
            fedetf.fedkit_extend_model(model, ctx)
        return model

    server, client = build(None), build("a")
    assert torch.equal(server.head.etf, client.head.etf)  # the same ETF, from the seed alone
    assert set(server.shared_state()) == {
        "backbone.weight",
        "backbone.bias",
        "head.proj.weight",
        "head.proj.bias",
        "head.beta",
    }
    assert client.is_private(f"extras.{fedetf.PERSONAL}.etf")


def test_segmentation_is_refused():
    with pytest.raises(FedkitError, match="fedetf needs a classification task"):
        run(tiny_seg(rounds=1), plugins={"fedetf": fedetf})
