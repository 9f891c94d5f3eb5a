"""``local.live_models``: clients of a plugin run build their model when first needed, at
most N stay live per process, the others idle as their snapshot; the records are those of
clients that build their model at set-up and keep it."""

from __future__ import annotations

import pytest

from fedkit_core import FedkitError, hookimpl, resume, run
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.pool import ModelPool
from fedkit_core.testing import InterruptAfter, tiny

pytestmark = pytest.mark.slow

#: 5 clients, 3 of them sampled each round: clients train, answer queries and evaluate
#: after others have taken the model
CONFIG = tiny(rounds=3, sample_fraction=0.6, **{"task": {"sites": 5}})


def records(results) -> tuple[list, dict]:
    """Every round's record and ``final``, without times."""
    rounds = [{k: v for k, v in r.items() if k != "seconds"} for r in results.rounds]
    return rounds, {k: v for k, v in results.final.items() if k != "wall_seconds"}


@pytest.fixture
def pool_watch(monkeypatch):
    """Counts the models built and checks after each take that no more than the pool's
    size are live (the clients' ``ctx.model``)."""
    seen = {"builds": 0, "most": 0}
    build, take = ClientRuntime.new_model, ModelPool.take

    def new_model(self):
        seen["builds"] += 1
        return build(self)

    def checked(self, client):
        take(self, client)
        members = [c for c in self.live.values() if c.ctx.model is not None]
        assert len(members) == len(self.live) <= self.size
        seen["most"] = max(seen["most"], len(self.live))

    monkeypatch.setattr(ClientRuntime, "new_model", new_model)
    monkeypatch.setattr(ModelPool, "take", checked)
    return seen


@pytest.mark.parametrize(
    "extra",
    [
        {"plugins": ["fca"]},  # a private head per client
        {"plugins": ["fca"], "keep_optimizer_state": True},  # optimiser state across rounds
        {"plugins": ["fedrep"], "keep_optimizer_state": True},  # requires_grad set by a plugin
        {"plugins": ["moon", "fedprox"]},  # tensors in ctx.state and ctx.scratch
    ],
    ids=["fca", "fca-optimizer", "fedrep-optimizer", "moon-fedprox"],
)
def test_idle_clients_give_the_records_of_live_ones(pool_watch, extra):
    config = {**CONFIG, **extra}
    live = run(config)
    assert pool_watch["builds"] == 5  # at set-up, one per client
    idle = run({**config, "local.live_models": 2})
    assert pool_watch["builds"] > 5 + 5  # clients went idle and were rebuilt
    assert pool_watch["most"] == 2
    assert records(idle) == records(live)


def test_idle_clients_in_worker_processes(pool_watch):
    config = {**CONFIG, "plugins": ["fca"], "keep_optimizer_state": True}
    live = run(config)
    idle = run({**config, "local.live_models": 1, "local.workers": 2})
    assert records(idle) == records(live)


def test_a_run_with_idle_clients_resumes_exactly(tmp_path):
    config = {**CONFIG, "plugins": ["fca"], "keep_optimizer_state": True, "rounds": 4}
    live = run(config)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(
            {**config, "checkpoint": True, "local.live_models": 1},
            out=out,
            observer=InterruptAfter(2),
        )
    assert records(resume(out)) == records(live)


class FailsOnce:
    """Fails the first client that ends its training in round 2, once (a retry follows):
    the client is then fully trained, so the retry must start from its state before."""

    def __init__(self) -> None:
        self.failed = False

    @hookimpl
    def fedkit_client_report(self, client):
        if client.round == 2 and not self.failed:
            self.failed = True
            raise RuntimeError("a transient failure")
        return None


def test_a_retried_idle_client_starts_from_its_state_before(pool_watch):
    config = {**CONFIG, "plugins": ["fca"], "keep_optimizer_state": True, "client_retries": 1}
    first, second = FailsOnce(), FailsOnce()
    live = run(config, plugins={"fails": first})
    idle = run({**config, "local.live_models": 1}, plugins={"fails": second})
    assert first.failed and second.failed  # a retried message leaves no event
    assert records(idle) == records(live)


class HoldsParameters:
    """Keeps the model's own parameters (not copies) in its scratch."""

    @hookimpl
    def fedkit_round_start(self, client):
        client.scratch["params"] = list(client.model.parameters())


def test_plugin_state_holding_the_model_is_refused():
    plugins = {"holds": HoldsParameters()}
    run({**CONFIG, "plugins": ["fca"], "rounds": 1}, plugins=plugins)  # fine with live models
    with pytest.raises(FedkitError, match=r"'holds' keeps a tensor of the model.*live_models"):
        run({**CONFIG, "plugins": ["fca"], "rounds": 1, "local.live_models": 1}, plugins=plugins)
