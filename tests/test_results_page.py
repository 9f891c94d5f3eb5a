"""benchmarks/results_page.py: its method and data-set tables, every comparison's config
valid, and the page's verdicts from paired differences (no training here)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from fedkit_core.config import load_yaml, parse_sets
from fedkit_core.resolve import resolve_config
from fedkit_core.results.compare import Comparison, paired_table, runspec_layers

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("results_page", ROOT / "benchmarks/results_page.py")
page = importlib.util.module_from_spec(spec)
sys.modules["results_page"] = page  # dataclasses look their module up
spec.loader.exec_module(page)


def test_each_data_set_runs_every_method_that_fits_against_its_baseline(monkeypatch):
    groups = {d.name: page.plan(d) for d in page.DATASETS}
    fedavg, fca, fed_mas, fedavg_ce, fedcb = page.METHODS[:5]
    assert groups["retina"] == {
        "fedavg": [fedavg, fca, fed_mas],
        fedavg_ce.runspec: [fedavg_ce, fedcb],  # FedCB against FedAvg with CE, as its paper
    }
    assert [m.runspec for m in groups["drive-chase"]["fedavg"]] == ["fedavg", "fed-lwr"]
    other = page.Method("X", "fca", "fed-mas", ("classification",))
    monkeypatch.setattr(page, "METHODS", [*page.METHODS, other])  # one line adds a method
    assert [m.runspec for m in page.plan(page.DATASETS[0])["fed-mas"]] == ["fed-mas", "fca"]


@pytest.mark.parametrize("dataset", page.DATASETS, ids=lambda d: d.name)
def test_every_comparison_config_resolves(dataset, monkeypatch):
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("the page's configs read ../shared/data beside the project, absent here")
    monkeypatch.chdir(ROOT)
    base = [load_yaml(dataset.config)]
    sets = parse_sets(dataset.pairs(None, quick=False))
    for methods in page.plan(dataset).values():
        for method in methods:
            resolve_config(runspec_layers(method.runspec, base, sets))
    if dataset.rounds:
        assert parse_sets(dataset.pairs(7, quick=False))["rounds"] == 7
        assert parse_sets(dataset.pairs(None, quick=True))["rounds"] == 2


def _found(method: list[float], baseline: list[float]) -> Comparison:
    def entry(values):
        return {"mean": sum(values) / len(values), "std": 0.0, "per_seed": values}

    table = {
        "fedavg": {
            "final.global.bacc": entry(baseline),
            "final.clients_mean.bacc": entry(baseline),
        },
        "fca": {"final.global.bacc": entry(method), "final.clients_mean.bacc": entry(method)},
    }
    return Comparison(table, "bacc", [0, 1, 2, 3, 4], paired_table(table))


def test_verdicts_say_win_or_why_not():
    fca = page.METHODS[1]
    win = page.verdict(fca, "FedAvg", _found([0.6, 0.61, 0.62, 0.6, 0.61], [0.5] * 5), False)
    assert "FCA wins" in win and "Why" not in win
    noise = page.verdict(fca, "FedAvg", _found([0.6, 0.4, 0.55, 0.45, 0.5], [0.5] * 5), False)
    assert "does not win (the interval contains 0)" in noise and fca.why_not in noise
