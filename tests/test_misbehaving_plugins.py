"""Plugins that misbehave are named (issue 34): a metric that shadows a built-in one or is not
finite is left out with a warning naming its plugin, one of the wrong type is an error naming
it, and an aggregate that is not finite is blamed on its aggregator, not on the clients. A
full disk is the machine's error, not a plugin's."""

import json
import logging
import os
from pathlib import Path

import pytest
import yaml

from fedkit_core import FedkitError, hookimpl, resume, run
from fedkit_core.aggregation import weighted_average
from fedkit_core.cli import main
from fedkit_core.testing import tiny


class Scores:
    """Metrics of every kind: one named like a built-in (NaN), one NaN, one fine."""

    def __init__(self, own=float("nan")):
        self.own = own

    @hookimpl
    def fedkit_metrics(self, server, arrays):
        return {"bacc": float("nan"), "scores.broken": self.own, "scores.fine": 0.5}


@pytest.mark.slow
def test_plugin_metrics_never_replace_built_ins_and_non_finite_ones_are_missing(tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="fedkit"):
        results = run(tiny(rounds=2), plugins={"scores": Scores()}, out=out)
    plain = run(tiny(rounds=2))
    assert results.final["global"]["bacc"] == plain.final["global"]["bacc"]
    assert results.final["global"]["scores.fine"] == 0.5
    assert "scores.broken" not in results.final["global"]
    assert all("scores.broken" not in c for c in results.final["clients"].values())
    said = [r.getMessage() for r in caplog.records]
    assert (
        sum("plugin 'scores' gives a metric 'bacc', the name of a built-in" in m for m in said) == 1
    )
    assert sum("plugin 'scores' gave nan for its metric 'scores.broken'" in m for m in said) == 1
    assert main(["report", str(out)]) == 0  # and it plots


def test_a_plugin_metric_of_the_wrong_type_names_its_plugin():
    with pytest.raises(FedkitError, match=r"plugin 'scores': its metric 'scores.broken' is 'high'"):
        run(tiny(rounds=1), plugins={"scores": Scores(own="high")})


class NanWeights:
    """An aggregator whose weights come out NaN (0 / 0)."""

    @hookimpl
    def fedkit_aggregate(self, server, updates):
        return weighted_average([u.arrays for u in updates], [float("nan")] * len(updates))


def test_an_aggregate_that_is_not_finite_names_the_aggregating_plugin():
    with pytest.raises(FedkitError, match=r"aggregate of round 1 made by plugin 'nanagg'") as err:
        run(tiny(rounds=2), plugins={"nanagg": NanWeights()})
    assert "learning rate" not in str(err.value)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_the_machines_error_with_the_way_to_go_on(tmp_path, monkeypatch, capsys):
    """From round 2 on, every file a client checkpoints is written to /dev/full (a real
    ENOSPC from the kernel): exit 2 with the hint to resume, the rounds before intact."""
    import tempfile

    real = tempfile.mkstemp
    full = {"on": True}

    def mkstemp(*args, dir=None, **kwargs):
        fd, name = real(*args, dir=dir, **kwargs)
        committed = Path(dir).parents[1] / "latest.json"  # dir: checkpoint/clients/<id>
        if full["on"] and "clients" in str(dir) and committed.exists():
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=3, checkpoint=True)))
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", "-c", str(config), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device writing" in err and "(No space left on device)" in err
    assert f"free space and run `fedkit resume {out}`" in err and "bug" not in err
    assert json.loads((out / "checkpoint" / "latest.json").read_text())["round"] == 1
    full["on"] = False
    assert resume(out).final["global"] == run(tiny(rounds=3)).final["global"]


class Columns:
    """Metrics and a summary named like metrics.csv's own columns."""

    @hookimpl
    def fedkit_metrics(self, server, arrays):
        return {"epsilon": 0.01, "round": 999, "split": 1.0, "columns.own": 0.5}

    @hookimpl
    def fedkit_summary(self, server, scopes):
        return {"fairness_std": 7.0, "scope": 1.0, "columns.summary": 0.25}


@pytest.mark.slow
def test_plugin_metrics_never_replace_metrics_csv_columns(tmp_path, caplog):
    """Before: a plugin metric named epsilon or round overwrote the csv's cells (epsilon
    0.01 where the run's was 7.08, round 999); only head_acc warned."""
    import csv

    out = tmp_path / "run"
    config = tiny(rounds=2, dp={"level": "client", "noise_multiplier": 0.5, "clip": 1.0})
    with caplog.at_level(logging.WARNING, logger="fedkit"):
        results = run(config, plugins={"columns": Columns()}, out=out)
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert {r["round"] for r in rows} == {"1", "2"}
    assert {r["split"] for r in rows} == {"val", "test"}
    assert {r["scope"] for r in rows} >= {"global", "clients_mean"}
    epsilon = results.rounds[-1]["privacy"]["epsilon"]
    assert {float(r["epsilon"]) for r in rows if r["round"] == "2"} == {epsilon} != {0.01}
    assert all(r["fairness_std"] != "7.0" for r in rows)
    assert results.final["global"]["columns.own"] == 0.5
    said = [r.getMessage() for r in caplog.records]
    for name in ("epsilon", "round", "split", "fairness_std", "scope"):
        assert sum(f"gives a metric {name!r}, the name of a built-in" in m for m in said) == 1


class Crashes:
    """A plugin with a bug: its round start raises."""

    @hookimpl
    def fedkit_round_start(self, client):
        return {}["missing"]


@pytest.mark.slow
def test_a_crashing_plugin_is_named_and_debug_output_does_not_ask_for_debug(monkeypatch):
    monkeypatch.delenv("FEDKIT_DEBUG", raising=False)
    with pytest.raises(FedkitError) as err:
        run(tiny(rounds=1), plugins={"crashy": Crashes()})
    text = str(err.value)
    assert "plugin 'crashy' raised KeyError: 'missing'" in text
    assert "round 1" in text and "rerun with --debug" in text
    monkeypatch.setenv("FEDKIT_DEBUG", "1")  # what `fedkit ... --debug` sets
    with pytest.raises(FedkitError) as err:
        run(tiny(rounds=1), plugins={"crashy": Crashes()})
    assert "plugin 'crashy' raised" in str(err.value) and "--debug" not in str(err.value)
