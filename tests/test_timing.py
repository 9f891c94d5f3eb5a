"""Time to a target in ``fedkit compare``: parsing, the first round at or above it in
simulated (or wall) time, fractions and paired intervals, and the command end to end."""

from __future__ import annotations

import json

import pytest

from fedkit_core.cli import main
from fedkit_core.errors import FedkitError
from fedkit_core.results.timing import parse_target, target_table, time_to_target
from fedkit_core.testing import REPO_ROOT, tiny


def results(scores, times=None, step=10.0):
    """A run whose round k scores ``scores[k]`` on the test split, at ``times[k]`` s."""
    times = times or [step * (k + 1) for k in range(len(scores))]
    rounds = [
        {
            "round": k + 1,
            "seconds": 1.0,
            "simulated_seconds": t,
            "evaluated": ["val", "test"],
            "global": {"bacc": s},
            "val": {"global": {"bacc": s - 0.1}},
        }
        for k, (s, t) in enumerate(zip(scores, times))
    ]
    return {"final": {"simulated_seconds": times[-1]}, "rounds": rounds}


def test_a_target_names_a_split_a_scope_a_metric_and_a_value():
    target = parse_target("final.global.bacc=0.80")
    assert (target.split, target.scope, target.metric, target.value) == (
        "final",
        "global",
        "bacc",
        0.8,
    )
    assert target.tests and not parse_target("val.clients_mean.bacc=0.7").tests
    for bad in (
        "final.global.bacc",
        "global.bacc=0.8",
        "final.global.bacc=high",
        "best.global.bacc=1",
    ):
        with pytest.raises(FedkitError, match="SPLIT.SCOPE.METRIC=VALUE"):
            parse_target(bad)


def test_the_time_to_target_is_the_first_round_at_or_above_it():
    target = parse_target("final.global.bacc=0.8")
    run = results([0.5, 0.8, 0.7, 0.9])
    assert time_to_target(run, target, "simulated") == 20.0
    assert time_to_target(run, target, "wall") == 2.0  # seconds of the rounds so far
    assert time_to_target(results([0.5, 0.79]), target, "simulated") is None
    assert time_to_target(run, parse_target("val.global.bacc=0.8"), "simulated") == 40.0
    untested = results([0.9, 0.9])
    untested["rounds"][0]["evaluated"] = ["val"]  # eval_test=improved skipped its test split
    assert time_to_target(untested, target, "simulated") == 20.0


def test_the_table_counts_seeds_reaching_it_and_pairs_the_seeds_that_both_did():
    target = parse_target("final.global.bacc=0.8")
    runs = {
        "fedavg": [results([0.5, 0.9]), results([0.5, 0.85]), results([0.6, 0.7])],
        "fedavg+fedbuff": [results([0.9], step=5), results([0.5, 0.81], step=4), results([0.85])],
    }
    table = target_table(runs, target)
    assert table["clock"] == "simulated"
    assert table["runspecs"]["fedavg"]["per_seed"] == [20.0, 20.0, None]
    assert table["runspecs"]["fedavg"]["reached"] == pytest.approx(2 / 3)
    assert table["runspecs"]["fedavg+fedbuff"]["per_seed"] == [5.0, 8.0, 10.0]
    diff = table["diff"]["fedavg+fedbuff"]
    assert diff["seeds"] == 2 and diff["per_seed"] == [-15.0, -12.0] and diff["wins"] == 2
    with pytest.raises(FedkitError, match="no run scored final.global.nope"):
        target_table(runs, parse_target("final.global.nope=1"))


@pytest.mark.slow
def test_compare_prints_the_time_to_target_and_draws_the_score_against_time(tmp_path, capsys):
    sites = REPO_ROOT / "examples" / "sites" / "straggler.yaml"
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(tiny(rounds=2)))
    code = main(
        [
            "compare",
            "fedavg",
            "fedavg+fedbuff",
            "--config",
            str(config),
            "--seeds",
            "0,1",
            "--sites",
            str(sites),
            "--target",
            "final.global.acc=0.3",
            "--out",
            str(tmp_path / "cmp"),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Time to final.global.acc=0.3" in printed and "fedavg+fedbuff" in printed
    summary = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    times = summary["time_to_target"]
    assert times["clock"] == "simulated" and set(times["runspecs"]) == {"fedavg", "fedavg+fedbuff"}
    assert "final.simulated_seconds" in summary["fedavg"]
    assert (tmp_path / "cmp" / "compare-time.png").is_file()
    assert "Time to final.global.acc=0.3" in (tmp_path / "cmp" / "compare.md").read_text()
    run = json.loads((tmp_path / "cmp" / "fedavg" / "seed0" / "results.json").read_text())
    assert run["config"]["eval_test"] == "every" and run["config"]["sites"]["profiles"]
