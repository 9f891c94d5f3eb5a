"""The convergence rule: the seed-mean validation curve's trend over the last fifth."""

from __future__ import annotations

import pytest

from fedkit_core.results.convergence import convergence, convergence_note, validation_curve


def fake_run(values: dict[int, float], rounds: int, scope: str = "global") -> dict:
    """A results dict whose validation main metric (bacc) takes ``values`` per round."""
    records = []
    for r in range(1, rounds + 1):
        record = {"round": r}
        if r in values:
            val = {"clients_mean": {"bacc": values[r] - 0.1}}
            if scope == "global":
                val["global"] = {"bacc": values[r]}
            record["val"] = val
        records.append(record)
    return {
        "task": {"main_metric": "bacc"},
        "config": {"rounds": rounds},
        "rounds": records,
        "final": {"best": {"scope": scope}},
    }


def test_a_flat_noisy_curve_converges_and_a_rising_one_does_not():
    flat = {r: 0.80 + (0.004 if r % 2 else -0.004) for r in range(1, 21)}
    rising = {r: 0.50 + 0.01 * r for r in range(1, 21)}
    found = convergence([fake_run(flat, 20)])
    assert found["rounds"] == [16, 17, 18, 19, 20]
    assert found["converged"] is True
    assert found["spread"] == pytest.approx(0.008)  # the noise is reported, not judged
    up = convergence([fake_run(rising, 20)])
    assert up["trend"] == pytest.approx(0.04)  # slope 0.01 over rounds 16-20
    assert up["converged"] is False


def test_the_seed_mean_is_judged():
    # two seeds moving in opposite directions: their mean is flat
    a = {r: 0.6 + 0.01 * r for r in range(1, 11)}
    b = {r: 0.8 - 0.01 * r for r in range(1, 11)}
    found = convergence([fake_run(a, 10), fake_run(b, 10)])
    assert found["trend"] == pytest.approx(0.0, abs=1e-12)
    assert found["converged"] is True


def test_without_a_global_model_the_clients_mean_is_used():
    values = {r: 0.5 + 0.02 * r for r in range(1, 11)}
    run = fake_run(values, 10, scope="clients_mean")
    assert validation_curve(run)[10] == pytest.approx(0.6)  # values[10] - 0.1
    assert convergence([run])["converged"] is False


def test_too_few_evaluated_rounds_say_nothing():
    sparse = {r: 0.7 for r in (5, 10)}  # eval_every=5 over 10 rounds: one round in the tail
    found = convergence([fake_run(sparse, 10)])
    assert found["converged"] is None and found["trend"] is None
    note = convergence_note({"fedavg": found})
    assert "too few evaluated rounds" in note


def test_the_note_names_each_runspec():
    flat = {r: 0.8 for r in range(1, 11)}
    rising = {r: 0.1 * r for r in range(1, 11)}
    note = convergence_note(
        {"fedavg": convergence([fake_run(flat, 10)]), "fca": convergence([fake_run(rising, 10)])}
    )
    assert "fedavg: converged" in note and "fca: NOT converged" in note


def test_the_trend_carries_its_standard_error_and_the_note_flags_noise_beyond_the_rule():
    straight = {r: 0.5 + 0.01 * r for r in range(1, 21)}
    assert convergence([fake_run(straight, 20)])["trend_se"] == pytest.approx(0.0, abs=1e-9)
    # a flat curve whose round-to-round noise (+-0.03) dwarfs the 0.005 tolerance
    noisy = {r: 0.5 + (0.03, -0.03, 0.0, 0.02, -0.02)[r % 5] for r in range(1, 51)}
    found = convergence([fake_run(noisy, 50)])
    assert found["trend_se"] > found["tolerance"]
    note = convergence_note({"fedavg": found})
    assert f"± {found['trend_se']:.4f}" in note and "noise larger than the tolerance" in note
    calm = convergence([fake_run({r: 0.8 for r in range(1, 21)}, 20)])
    assert "noise larger" not in convergence_note({"fedavg": calm})
    two = convergence([fake_run({r: 0.7 for r in (9, 10)}, 10)])  # two points: no error
    assert two["trend_se"] is None and convergence_note({"fedavg": two}).count("±") == 1
