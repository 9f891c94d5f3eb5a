"""Secure aggregation on the Flower engine (Flower's SecAgg+ workflow and mod): the server
sees only the weighted mean of the updates, and the global model equals the plain run's to
the quantisation's tolerance; methods that need individual updates are refused, naming why;
client-level DP composes with it (clipping on the clients, noise on the unmasked sum)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from fedkit_core import FedkitError, run  # noqa: E402
from fedkit_core.engines.checkpoint import ServerCheckpoints  # noqa: E402
from fedkit_core.resolve import resolve_config  # noqa: E402
from fedkit_core.testing import tiny  # noqa: E402

THREAD = {"engine": "flower", "flower": {"backend": "thread"}, "checkpoint": True}
#: coordinates quantised in [-1, 1] with 2^22 levels (step 4.8e-7) after weighting by
#: num_examples / 100: one round's secure mean is within 1e-5 of the plain one
SECURE = {"enabled": True, "clip_range": 1.0, "max_weight": 100.0}
TOLERANCE = 1e-5


def global_state(path: Path) -> dict[str, torch.Tensor]:
    return ServerCheckpoints(path / "checkpoint").load()["global_state"]


@pytest.mark.slow
def test_a_secure_run_gives_the_plain_runs_model(tmp_path):
    config = tiny(rounds=1, **THREAD)
    plain = run(config, out=tmp_path / "plain")
    secure = run({**config, "secagg": SECURE}, out=tmp_path / "secure")
    a, b = global_state(tmp_path / "plain"), global_state(tmp_path / "secure")
    floats = [k for k in a if a[k].is_floating_point()]
    worst = max(float((a[k] - b[k]).abs().max()) for k in floats)
    assert 0 < worst < TOLERANCE  # masked and quantised, yet the same model
    assert plain.final["global"]["acc"] == secure.final["global"]["acc"]
    # the server recorded each client's num_examples only: no losses, no arrays
    assert all(not scalars for scalars in secure.rounds[0]["train"].values())


@pytest.mark.slow
def test_client_level_dp_composes_with_secure_aggregation(tmp_path):
    config = tiny(rounds=2, dp={"level": "client", "clipping": "adaptive"}, **THREAD)
    results = run({**config, "secagg": SECURE}, out=tmp_path / "dp")
    eps = [r["privacy"]["epsilon"] for r in results.rounds]
    assert eps[0] < eps[1]
    assert results.rounds[1]["privacy"]["clip"] != 1.0  # the bit's sum moved the norm


def test_methods_that_need_individual_updates_are_refused_with_the_reason():
    pytest.importorskip("fedkit_baselines")
    with pytest.raises(FedkitError, match="only the sum.*fedce"):
        resolve_config(tiny(plugins=["fedce"], secagg={"enabled": True}, engine="flower"))
    with pytest.raises(FedkitError, match="fed-lwr.cka"):
        resolve_config(tiny(plugins=["fed-lwr"], secagg={"enabled": True}, engine="flower"))
