"""Every method of issue 30 on the Flower engine (thread backend) gives the local engine's
results; each aggregator runs beside one of the other methods, so eight runs cover all thirteen
plugins (the twelve methods and the Flower-strategy adapter) and their composition."""

from __future__ import annotations

import pytest

from fedkit_core import run
from fedkit_core.testing import tiny

pytestmark = pytest.mark.slow

pytest.importorskip("flwr")

COMBINATIONS = [
    ["scaffold", "fedbn"],
    ["fedadam", "fedper"],
    ["fedyogi", "apfl"],
    ["fedadagrad", "perfedavg"],
    ["fedavgm", "cyclic"],
    ["fednova"],
    ["feddyn"],
    ["flower-strategy"],
]


def close(a, b, tol: float) -> bool:
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
        )
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return isinstance(b, (int, float)) and abs(a - b) <= tol
    return a == b


@pytest.mark.parametrize("plugins", COMBINATIONS, ids="+".join)
def test_the_flower_engine_gives_the_local_engines_results(plugins):
    extra = {}
    if "flower-strategy" in plugins:
        extra = {"flower-strategy": {"strategy": "FedTrimmedAvg", "args": {"beta": 0.34}}}
    config = tiny(rounds=2, plugins=plugins, **extra)
    local = run(config)
    flower = run({**config, "engine": "flower", "flower": {"backend": "thread"}})
    for scope in ("global", "clients", "clients_mean", "fairness", "views", "bytes"):
        assert close(local.final[scope], flower.final[scope], 1e-6), scope
    for mine, theirs in zip(local.rounds, flower.rounds, strict=True):
        assert theirs["sampled"] == mine["sampled"]
        assert close(mine["train"], theirs["train"], 1e-6)
    assert local["normalisation"] == flower["normalisation"]
