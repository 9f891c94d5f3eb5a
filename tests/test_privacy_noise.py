"""The DP noise is secret: nothing a run writes lets a reader regenerate it (the attack that
removed it exactly when it was seeded from the recorded seed fails now), two runs of one seed
draw different noise, resume keeps what does not come from the secret stream, and the
test-only ``dp.reproducible_noise`` switch is marked NOT PRIVATE."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from fedkit_core import resume, run
from fedkit_core.cli.display import privacy_line
from fedkit_core.contract.messages import Update
from fedkit_core.engines.checkpoint import ServerCheckpoints
from fedkit_core.hooks.context import derive_seed
from fedkit_core.privacy import noise
from fedkit_core.privacy.client_level import floating
from fedkit_core.privacy.layer import ServerPrivacy
from fedkit_core.resolve import resolve_config
from fedkit_core.testing import InterruptAfter, tiny

DP = {"level": "client", "noise_multiplier": 5.0}
#: the size of a torch CPU generator's state (a checkpoint's client rng)
GENERATOR_STATE = torch.Generator().get_state().numel()


def _global(path: Path) -> dict[str, torch.Tensor]:
    return ServerCheckpoints(path / "checkpoint").load()["global_state"]


def _candidates(run_dir: Path) -> list[torch.Generator]:
    """Every generator a reader of the run's files could rebuild: each integer written in a
    text file, as a seed and as the seed of fedkit's old ``(seed, "dp", round)`` stream, and
    each generator state stored in a checkpoint."""
    numbers: set[int] = set()
    states: list[torch.Tensor] = []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        if path.suffix == ".pt":
            stack = [torch.load(path, weights_only=False)]
            while stack:
                item = stack.pop()
                if isinstance(item, dict):
                    stack.extend(item.values())
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)
                elif isinstance(item, torch.Tensor) and item.dtype == torch.uint8:
                    states += [item] if item.numel() == GENERATOR_STATE else []
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # figures
            continue
        numbers |= {int(t) for t in re.findall(r"\d+", text) if int(t) < 2**63}
    assert numbers and states  # the attack has material: the seed, the clients' rng states
    out = []
    for n in sorted(numbers):
        out.append(torch.Generator().manual_seed(n))
        out.append(torch.Generator().manual_seed(derive_seed(n, "dp", 1)))
    for state in states:
        generator = torch.Generator()
        generator.set_state(state)
        out.append(generator)
    return out


def _best_residual(run_dir: Path, clean: dict[str, torch.Tensor]) -> float:
    """The smallest distance to the noise-free model the reader gets by subtracting noise
    regenerated from any candidate generator, with the std and denominator the run recorded
    (round 1 of a run of one round), over every floating entry but batch norm's variances."""
    results = json.loads((run_dir / "results.json").read_text())
    std = results["rounds"][0]["privacy"]["noise_std"]
    denominator = results["final"]["privacy"]["denominator"]
    noisy = _global(run_dir)
    best = float("inf")
    for generator in _candidates(run_dir):
        worst = 0.0
        for k in floating(noisy):
            drawn = torch.randn(noisy[k].shape, generator=generator, dtype=torch.float64)
            if k.endswith("running_var"):  # clamped at 0 after the noise: not invertible
                continue
            denoised = noisy[k].double() - std * drawn / denominator
            worst = max(worst, float((denoised - clean[k].double()).abs().max()))
        best = min(best, worst)
    return best


@pytest.mark.slow
def test_noise_regenerated_from_every_file_of_the_run_does_not_remove_it(tmp_path):
    config = tiny(rounds=1, checkpoint=True, dp=DP)
    run({**config, "dp": {**DP, "noise_multiplier": 0.0}}, out=tmp_path / "clean")
    clean = _global(tmp_path / "clean")
    # the old attack works on a reproducible run: the test can fail
    shown = run({**config, "dp": {**DP, "reproducible_noise": True}}, out=tmp_path / "shown")
    assert shown.final["privacy"]["noise_secret"] is False
    assert _best_residual(tmp_path / "shown", clean) < 1e-5
    # a private run: no candidate comes near the noise-free model (the noise's std on each
    # coordinate of the mean is 5 / 3)
    first = run(config, out=tmp_path / "first")
    assert first.final["privacy"]["noise_secret"] is True
    assert _best_residual(tmp_path / "first", clean) > 1.0
    # same seed, same config: different noise, same accounting
    second = run(config, out=tmp_path / "second")
    a, b = _global(tmp_path / "first"), _global(tmp_path / "second")
    assert any(not torch.equal(a[k], b[k]) for k in floating(a))
    assert first.rounds[0]["privacy"] == second.rounds[0]["privacy"]
    assert yaml.safe_load((tmp_path / "first" / "config.yaml").read_text())["seed"] == 0


@pytest.mark.slow
def test_a_resumed_dp_run_keeps_what_is_not_drawn_from_the_secret_stream(tmp_path):
    """Resume under DP: the rounds, the clients sampled (all here), epsilon after every
    round and the noise's std are those of an uninterrupted run; the model differs (fresh
    secret noise). Under dp.reproducible_noise the resumed model is the uninterrupted one."""
    config = tiny(rounds=2, checkpoint=True, dp=DP)
    whole = run(config, out=tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(config, out=tmp_path / "cut", observer=InterruptAfter(1))
    resumed = resume(tmp_path / "cut")
    assert [r["round"] for r in resumed.rounds] == [1, 2]
    assert [r["sampled"] for r in resumed.rounds] == [r["sampled"] for r in whole.rounds]
    assert [r["privacy"] for r in resumed.rounds] == [r["privacy"] for r in whole.rounds]
    assert resumed.final["privacy"] == whole.final["privacy"]
    a, b = _global(tmp_path / "whole"), _global(tmp_path / "cut")
    assert any(not torch.equal(a[k], b[k]) for k in floating(a))

    exact = tiny(rounds=2, checkpoint=True, dp={**DP, "reproducible_noise": True})
    whole = run(exact, out=tmp_path / "exact-whole")
    with pytest.raises(KeyboardInterrupt):
        run(exact, out=tmp_path / "exact-cut", observer=InterruptAfter(1))
    resume(tmp_path / "exact-cut")
    a, b = _global(tmp_path / "exact-whole"), _global(tmp_path / "exact-cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def _noisy_mean(config: dict, rnd: int = 1) -> torch.Tensor:
    cfg, _ = resolve_config(config)
    layer = ServerPrivacy(cfg, 3)
    g = {"w": torch.zeros(1000)}
    (update,) = layer.updates(g, [Update(c, g, {}) for c in "abc"], {}, rnd)
    return update.arrays["w"]


def test_two_draws_of_one_seed_differ_unless_the_not_private_switch_is_on(caplog):
    secret = tiny(dp=DP)
    assert not torch.equal(_noisy_mean(secret), _noisy_mean(secret))
    shown = tiny(dp={**DP, "reproducible_noise": True})
    with caplog.at_level("WARNING", logger="fedkit"):
        assert torch.equal(_noisy_mean(shown), _noisy_mean(shown))
    assert "NOT PRIVATE" in caplog.text
    # the sampling the accountant amplifies on is secret too
    cfg, _ = resolve_config(tiny(sample_fraction=0.5, dp=DP))
    ids = [f"c{i}" for i in range(40)]
    draws = {tuple(ServerPrivacy(cfg, 40).sample(ids, 1)) for _ in range(5)}
    assert len(draws) > 1


def test_the_not_private_switch_is_visible_in_results_and_on_the_console():
    cfg, _ = resolve_config(tiny(dp={**DP, "reproducible_noise": True}))
    summary = ServerPrivacy(cfg, 3).summary([], {})
    assert summary["noise_secret"] is False and summary["noise"].startswith("NOT PRIVATE")
    assert "NOT PRIVATE" in privacy_line(summary)
    cfg, _ = resolve_config(tiny(dp=DP))
    summary = ServerPrivacy(cfg, 3).summary([], {})
    assert summary["noise_secret"] is True and summary["noise"] == noise.SECRET
    assert "NOT PRIVATE" not in privacy_line(summary)


@pytest.mark.slow
def test_flower_and_local_dp_runs_agree_on_all_but_the_secret_noise(tmp_path):
    """Flower (thread backend) against the local engine under client-level DP: the rounds,
    clients, epsilon and noise std agree; the models differ (each draws its own secret
    noise) unless dp.reproducible_noise makes both draw the seed's."""
    pytest.importorskip("flwr")
    flower = {"engine": "flower", "flower": {"backend": "thread"}}
    for name, dp in (("secret", DP), ("exact", {**DP, "reproducible_noise": True})):
        config = tiny(rounds=2, checkpoint=True, dp=dp)
        local = run(config, out=tmp_path / name / "local")
        other = run({**config, **flower}, out=tmp_path / name / "flower")
        for key in ("round", "sampled", "privacy"):
            assert [r[key] for r in local.rounds] == [r[key] for r in other.rounds]
        assert local.final["privacy"] == other.final["privacy"]
        a, b = _global(tmp_path / name / "local"), _global(tmp_path / name / "flower")
        gap = max(float((a[k].double() - b[k].double()).abs().max()) for k in floating(a))
        assert gap > 0.1 if name == "secret" else gap < 1e-5
