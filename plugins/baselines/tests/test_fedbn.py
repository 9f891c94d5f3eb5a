"""FedBN and ``bn=local``: batch-norm layers (weights and statistics) never leave a client and
persist on it, results.json says so, the two are the same run, and a model without batch norm
is refused."""

from __future__ import annotations

import pytest
from torch import nn

from fedkit_core import FedkitError, run
from fedkit_core.plugin import FedModel, hookimpl
from fedkit_core.testing import tiny

from .baseline_probes import Uploads, same


class Norms:
    """Each client's batch-norm entries at the start and the end of each round."""

    def __init__(self) -> None:
        self.layers: list[str] = []
        self.start, self.end = {}, {}

    def _state(self, client):
        self.layers = client.model.batch_norm_layers()
        prefixes = tuple(f"{name}." for name in self.layers)
        return {
            k: v.detach().clone()
            for k, v in client.model.state_dict().items()
            if k.startswith(prefixes)
        }

    @hookimpl
    def fedkit_round_start(self, client):
        self.start[(client.id, client.round)] = self._state(client)

    @hookimpl
    def fedkit_client_report(self, client):
        self.end[(client.id, client.round)] = self._state(client)


def test_batch_norm_stays_on_each_client_and_persists():
    uploads, norms = Uploads(), Norms()
    results = run(tiny(rounds=2, plugins=["fedbn"]), plugins={"uploads": uploads, "norms": norms})
    normalisation = results["normalisation"]
    assert (
        normalisation["bn"] == "local"
        and normalisation["batch_norm_layers"] == len(norms.layers) > 0
    )
    assert "each client's own" in normalisation["global_view"]
    prefixes = tuple(f"{name}." for name in norms.layers)
    for rnd in uploads.updates:
        for arrays in rnd.values():
            assert arrays and not any(k.startswith(prefixes) for k in arrays)
    assert not same(norms.end[("site0", 2)], norms.end[("site1", 2)]), "each client has its own"
    assert same(norms.start[("site0", 2)], norms.end[("site0", 1)]), "and continues from it"


def test_fedbn_is_fedavg_with_bn_local():
    a = run(tiny(rounds=2, plugins=["fedbn"]))
    b = run(tiny(rounds=2, bn="local"))
    assert a.final["global"] == b.final["global"] and a.final["clients"] == b.final["clients"]
    assert a["normalisation"] == b["normalisation"]


class NoNorm:
    @hookimpl
    def fedkit_build_model(self, ctx):
        channels = ctx.task.in_channels
        body = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 8), nn.ReLU()
        )
        return FedModel(body, nn.Linear(8, ctx.task.num_classes), 8)


def test_a_model_without_batch_norm_is_refused_or_recorded():
    with pytest.raises(FedkitError, match="fedbn keeps the batch-norm layers local"):
        run(tiny(rounds=1, plugins=["fedbn"]), plugins={"nonorm": NoNorm()})
    with pytest.raises(FedkitError, match="bn=local"):
        run(tiny(rounds=1, bn="local"), plugins={"nonorm": NoNorm()})
    results = run(tiny(rounds=1), plugins={"nonorm": NoNorm()})
    assert results["normalisation"]["bn"] == "none"
