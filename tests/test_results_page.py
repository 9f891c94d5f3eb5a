"""benchmarks/results_page.py: every method's comparison config valid, the command it
prints, and its verdicts from paired differences (no training here)."""

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


def test_the_five_seed_methods_each_have_a_claim_and_a_config():
    assert [m.slug for m in page.METHODS] == ["fca", "fed-mas", "fedcb", "fed-lwr", "fedhelp"]
    for method in page.METHODS:
        assert method.claims and (ROOT / method.config).is_file(), method.name
        assert method.runspecs[2:] == ["pooled", "solo"]  # the references beside each method
        assert page.not_run(method)["verdict"] == "not run here"  # never a verdict unrun


@pytest.mark.parametrize("method", page.METHODS, ids=lambda m: m.slug)
def test_every_comparison_config_resolves(method, monkeypatch):
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("the page's configs read ../shared/data beside the project, absent here")
    monkeypatch.chdir(ROOT)
    base = [load_yaml(method.config)]
    for runspecs, sets in [(method.runspecs, [])] + [
        (a.runspecs, list(a.sets)) for a in method.ablations
    ]:
        for runspec in runspecs:
            resolve_config(runspec_layers(runspec, base, parse_sets(sets)))
        quick = parse_sets(list(method.quick))
        assert quick["rounds"] == 2


def test_the_printed_command_reproduces_the_comparison():
    fca = page.METHODS[0]
    text = page.command(fca.runspecs, fca.config, ["rounds=2"], "0,1")
    assert text == (
        "fedkit compare fedavg fca pooled solo --config benchmarks/results/retina-pretrained.yaml "
        "--set rounds=2 --seeds 0,1"
    )


def _found(specs: dict[str, dict[str, list[float]]]) -> Comparison:
    def entry(values):
        return {"mean": sum(values) / len(values), "std": 0.0, "per_seed": values}

    table = {s: {k: entry(v) for k, v in keys.items()} for s, keys in specs.items()}
    return Comparison(table, "bacc", [0, 1, 2, 3, 4], paired_table(table))


def _method(*claims):
    return page.Method("X", "x", "", "", "c.yaml", "fedavg", "fca", tuple(claims))


def test_a_claim_is_reproduced_only_when_its_paired_interval_excludes_zero_its_way():
    higher = _method(page.Claim("final.global.bacc"))
    base = {"final.global.bacc": [0.5, 0.52, 0.49, 0.51, 0.5]}
    win = _found({"fedavg": base, "fca": {"final.global.bacc": [0.6, 0.61, 0.6, 0.62, 0.6]}})
    ok, said = page.judge(higher, win, {}, [0, 1, 2, 3, 4])
    assert ok and "holds" in said[0]
    noise = _found({"fedavg": base, "fca": {"final.global.bacc": [0.6, 0.4, 0.55, 0.45, 0.5]}})
    ok, said = page.judge(higher, noise, {}, [0, 1, 2, 3, 4])
    assert not ok and "not distinguishable from seed noise" in said[0]
    lower = _method(page.Claim("final.global.bacc", higher=False))  # the paper: it falls
    ok, said = page.judge(lower, win, {}, [0, 1, 2, 3, 4])
    assert not ok and "reversed" in said[0]


def test_the_g_and_s_claim_averages_the_global_and_the_clients_scores():
    found = _found(
        {
            "fedavg": {"final.global.bacc": [0.4] * 5, "final.clients_mean.bacc": [0.6] * 5},
            "fca": {"final.global.bacc": [0.3] * 5, "final.clients_mean.bacc": [0.9] * 5},
        }
    )
    assert page.per_seed(found, "fca", "gs.bacc") == pytest.approx([0.6] * 5)
    ok, said = page.judge(_method(page.Claim("gs.bacc")), found, {}, [0, 1, 2, 3, 4])
    assert ok and said[0].startswith("mean of global and clients' bacc (G&S average): +0.1000")
    missing = _method(page.Claim("final.global.tail_acc"))
    ok, said = page.judge(missing, found, {}, [0, 1, 2, 3, 4])
    assert not ok and "not measured" in said[0]


def test_every_client_must_gain_significantly_for_a_per_client_claim():
    def runs(per_client):  # {client: [value per seed]} -> the runs of one runspec
        seeds = range(len(next(iter(per_client.values()))))
        return [
            {
                "task": {"client_ids": list(per_client)},
                "final": {"clients": {c: {"acc": v[s]} for c, v in per_client.items()}},
            }
            for s in seeds
        ]

    base = {"c0": [0.8, 0.81, 0.79, 0.8, 0.8], "c1": [0.5, 0.52, 0.48, 0.5, 0.51]}
    both = {"c0": [0.85, 0.86, 0.84, 0.85, 0.86], "c1": [0.6, 0.63, 0.58, 0.6, 0.61]}
    one = {"c0": [0.85, 0.86, 0.84, 0.85, 0.86], "c1": [0.5, 0.4, 0.6, 0.45, 0.55]}
    claim = _method(page.Claim("client.acc"))
    found = _found(
        {"fedavg": {"final.global.acc": [0.7] * 5}, "fca": {"final.global.acc": [0.7] * 5}}
    )
    seeds = [0, 1, 2, 3, 4]
    ok, said = page.judge(claim, found, {"fedavg": runs(base), "fca": runs(both)}, seeds)
    assert ok and "2 of 2 clients gain significantly" in said[0]
    ok, said = page.judge(claim, found, {"fedavg": runs(base), "fca": runs(one)}, seeds)
    assert not ok and "1 of 2 clients gain significantly" in said[0]


def test_fedcbs_diagnosis_measures_how_far_apart_its_class_vectors_are(monkeypatch):
    pytest.importorskip("fedkit_fedcb")
    monkeypatch.chdir(ROOT)
    fedcb = next(m for m in page.METHODS if m.slug == "fedcb")
    opts = load_yaml(fedcb.config)["fedcb"]
    prompts = ["a fundus photograph of {}", "{} in a retinal image"]
    try:
        grades = page.separation(opts["encoder"], opts["class_names"], prompts)
    except Exception as err:  # the offline text encoder is an extra (fedkit-fedcb[offline])
        pytest.skip(f"text encoder unavailable: {err}")
    diseases = page.separation(opts["encoder"], page.OCT_C8, prompts)
    assert -1 <= diseases[1] <= diseases[0] <= diseases[2] <= 1
    assert diseases[0] < grades[0]  # grades of one disease lie closer than distinct diseases
    assert "mean pairwise cosine" in fedcb.diagnosis(fedcb)[0]


def test_headroom_says_whether_centralised_training_leaves_a_gap_to_close():
    method = _method(page.Claim("final.global.bacc"), page.Claim("final.fairness.std", False))
    base = {"final.global.bacc": [0.5, 0.52, 0.49, 0.51, 0.5], "final.fairness.std": [0.1] * 5}
    above = {"final.global.bacc": [0.6, 0.61, 0.6, 0.62, 0.6], "final.fairness.std": [0.1] * 5}
    level = {"final.global.bacc": [0.51, 0.5, 0.5, 0.5, 0.52], "final.fairness.std": [0.1] * 5}
    said = page.headroom(method, _found({"fedavg": base, "pooled": above}))
    assert said[0].startswith("**Headroom.** global bACC, pooled minus fedavg: +0.1020")
    assert "there is a federated gap" in said[0]
    said = page.headroom(method, _found({"fedavg": base, "pooled": level}))
    assert "no measured federated gap" in said[0]
    fairer = {**level, "final.fairness.std": [0.05, 0.06, 0.05, 0.04, 0.05]}  # lower is better
    assert (
        "there is a federated gap"
        in page.headroom(method, _found({"fedavg": base, "pooled": fairer}))[0]
    )
    assert page.headroom(method, _found({"fedavg": base})) == []  # no references run
