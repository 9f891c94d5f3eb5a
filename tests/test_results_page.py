"""benchmarks/results_page.py: every method's comparison config valid, the command it
prints, and its verdicts from paired differences (no training here)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from fedkit_core.config import load_yaml, parse_sets
from fedkit_core.resolve import resolve_config
from fedkit_core.results.compare import Comparison, paired_table, runspec_layers
from fedkit_core.results.schema import Results

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("results_page", ROOT / "benchmarks/results_page.py")
page = importlib.util.module_from_spec(spec)
sys.modules["results_page"] = page  # dataclasses look their module up
spec.loader.exec_module(page)


def test_every_seed_method_has_a_claim_a_config_and_a_mechanism():
    assert [m.slug for m in page.SECTIONS] == [
        "fca",
        "fed-mas",
        "flamby",
        "fedcb-pilot",
        "fedcb",
        "fedcb-0.1",
        "fed-lwr",
        "fedhelp",
    ]
    for method in page.METHODS:
        assert method.claims and (ROOT / method.config).is_file(), method.name
        assert method.runspecs[2:] == ["pooled", "solo"]  # the references beside each method
        assert method.mechanism is not None, method.name  # every section measures its mechanism
        assert page.not_run(method)["verdict"] == "not run here"  # never a verdict unrun
    assert page.not_run(page.FLAMBY)["claim"] == "outside reference"


@pytest.mark.parametrize("method", page.SECTIONS, ids=lambda m: m.slug)
def test_every_comparison_config_resolves(method, monkeypatch):
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("the page's configs read ../shared/data beside the project, absent here")
    monkeypatch.chdir(ROOT)
    base = [load_yaml(method.config)]
    own = list(getattr(method, "sets", ()))
    for runspecs, sets in [(method.runspecs, own)] + [
        (a.runspecs, own + list(a.sets)) for a in getattr(method, "ablations", ())
    ]:
        for runspec in runspecs:
            resolve_config(runspec_layers(runspec, base, parse_sets(sets)))
        quick = parse_sets(list(getattr(method, "quick", ("rounds=2",))))
        assert quick["rounds"] == 2


def test_the_printed_command_reproduces_the_comparison():
    fca = page.METHODS[0]
    text = page.command(fca.runspecs, fca.config, ["rounds=2"], "0,1")
    assert text == (
        "fedkit compare fedavg fca pooled solo --config benchmarks/results/isic2019.yaml "
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
    verdict, said = page.judge(higher, win, {}, [0, 1, 2, 3, 4])
    assert verdict == "reproduced" and "**reproduced**" in said[0]
    noise = _found({"fedavg": base, "fca": {"final.global.bacc": [0.6, 0.4, 0.55, 0.45, 0.5]}})
    verdict, said = page.judge(higher, noise, {}, [0, 1, 2, 3, 4])
    assert verdict == "not reproduced" and "no difference beyond seed noise" in said[0]
    assert "headroom not measured" in said[0]  # no pooled run: nothing says a gap exists
    lower = _method(page.Claim("final.global.bacc", higher=False))  # the paper: it falls
    verdict, said = page.judge(lower, win, {}, [0, 1, 2, 3, 4])
    assert verdict == "not reproduced" and "significantly worse" in said[0]


def test_an_ablations_answer_sets_its_last_runspec_against_each_of_the_others():
    """Fed-MAS's ablation: Eq. 3 against FedAvg (the paper's claim) and against the
    normalised factor (the question); a two-runspec ablation gives one answer per number."""
    claim = _method(page.Claim("final.global.bacc"))
    found = _found(
        {
            "fedavg": {"final.global.bacc": [0.41, 0.43, 0.40, 0.42, 0.41]},
            "fed-mas": {"final.global.bacc": [0.30, 0.31, 0.30, 0.29, 0.31]},
            "raw": {"final.global.bacc": [0.42, 0.43, 0.40, 0.43, 0.42]},
        }
    )
    said = page.answer(claim, found, {}, ("fedavg", "fed-mas", "raw"))
    assert "raw minus fedavg: +0.0060" in said and "no difference beyond seed noise" in said
    assert "raw minus fed-mas: +0.1180" in said and "a difference" in said
    assert "minus fedavg" not in page.answer(claim, found, {}, ("fed-mas", "raw"))


def test_a_verdicts_interval_stays_inside_the_metrics_range_as_the_table_does():
    """An accuracy difference lies in [-1, 1]: the verdict's t-interval is clipped there,
    as the paired-difference table (fedkit compare) clips it (FedCB at Dir 0.1 printed
    +1.0000 in the table and +1.0232 in the verdict)."""
    base = {"best.global.acc": [0.1, 0.6, 0.2]}
    noisy = _found({"fedavg": base, "fca": {"best.global.acc": [0.65, 0.6, 0.7]}})
    noisy.seeds = [0, 1, 2]
    tested, _ = page.paired_numbers(
        _method(page.Claim("best.global.acc")), noisy, {}, "fca", "fedavg"
    )
    assert tested[0].d["ci_t"][1] == 1.0 and tested[0].d["ci_t"][0] < 0
    assert "95% CI t [" in tested[0].text and ", +1.0000]" in tested[0].text


def test_the_g_and_s_claim_averages_the_global_and_the_clients_scores():
    found = _found(
        {
            "fedavg": {"final.global.bacc": [0.4] * 5, "final.clients_mean.bacc": [0.6] * 5},
            "fca": {"final.global.bacc": [0.3] * 5, "final.clients_mean.bacc": [0.9] * 5},
        }
    )
    assert page.per_seed(found, "fca", "gs.bacc") == pytest.approx([0.6] * 5)
    verdict, said = page.judge(_method(page.Claim("gs.bacc")), found, {}, [0, 1, 2, 3, 4])
    assert verdict == "reproduced"
    assert said[0].startswith(
        "mean of global and clients' bacc (G&S average), fca minus fedavg: +0.1000"
    )
    missing = _method(page.Claim("final.global.tail_acc"))
    verdict, said = page.judge(missing, found, {}, [0, 1, 2, 3, 4])
    assert verdict == "not reproduced" and "not measured" in said[0]


def _client_runs(per_client, metric="acc"):  # {client: [value per seed]} -> a runspec's runs
    seeds = range(len(next(iter(per_client.values()))))
    return [
        {
            "task": {"client_ids": list(per_client)},
            "final": {"clients": {c: {metric: v[s]} for c, v in per_client.items()}},
        }
        for s in seeds
    ]


def test_every_client_must_gain_significantly_for_a_per_client_claim():
    runs = _client_runs

    base = {"c0": [0.8, 0.81, 0.79, 0.8, 0.8], "c1": [0.5, 0.52, 0.48, 0.5, 0.51]}
    both = {"c0": [0.85, 0.86, 0.84, 0.85, 0.86], "c1": [0.6, 0.63, 0.58, 0.6, 0.61]}
    one = {"c0": [0.85, 0.86, 0.84, 0.85, 0.86], "c1": [0.5, 0.4, 0.6, 0.45, 0.55]}
    claim = _method(page.Claim("client.acc"))
    found = _found(
        {"fedavg": {"final.global.acc": [0.7] * 5}, "fca": {"final.global.acc": [0.7] * 5}}
    )
    seeds = [0, 1, 2, 3, 4]
    verdict, said = page.judge(claim, found, {"fedavg": runs(base), "fca": runs(both)}, seeds)
    assert verdict == "reproduced" and "2 of 2 clients gain significantly" in said[0]
    verdict, said = page.judge(claim, found, {"fedavg": runs(base), "fca": runs(one)}, seeds)
    assert verdict == "not reproduced" and "1 of 2 clients gain significantly" in said[0]


def test_fedcbs_diagnosis_measures_how_far_apart_its_class_vectors_are(monkeypatch):
    pytest.importorskip("fedkit_fedcb")
    monkeypatch.chdir(ROOT)
    fedcb = next(m for m in page.METHODS if m.slug == "fedcb")
    opts = load_yaml(fedcb.config)["fedcb"]
    grade_names = load_yaml(page.CONFIGS / "retina-fedcb.yaml")["fedcb"]["class_names"]
    prompts = ["a fundus photograph of {}", "{} in a retinal image"]
    try:
        grades = page.separation(opts["encoder"], grade_names, prompts)
    except Exception as err:  # the offline text encoder is an extra (fedkit-fedcb[offline])
        pytest.skip(f"text encoder unavailable: {err}")
    diseases = page.separation(opts["encoder"], page.OCT_C8, prompts)
    lesions = page.separation(opts["encoder"], opts["class_names"], prompts)
    assert -1 <= diseases[1] <= diseases[0] <= diseases[2] <= 1
    assert diseases[0] < grades[0]  # grades of one disease lie closer than distinct diseases
    assert lesions[0] < grades[0]  # the skin lesions' names are distinct, as OCT-C8's
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


def test_holm_multiplies_the_kth_smallest_p_value_by_m_minus_k_plus_one():
    assert page.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert page.holm([0.5]) == [0.5]
    assert page.holm([0.02, 0.02]) == pytest.approx([0.04, 0.04])


def test_a_per_client_claim_is_corrected_for_its_number_of_clients():
    """Six clients, each gaining by about two standard errors: each alone is significant at
    5% (the page's unadjusted intervals exclude 0), but not after Holm over the six."""
    seeds = [0, 1, 2, 3, 4]
    gain = [0.01, 0.03, 0.05, 0.02, 0.04]  # mean 0.03, t = 4.2: p ~ 0.014 alone
    base = {f"c{k}": [0.5 + 0.01 * s for s in seeds] for k in range(6)}
    method = {c: [b + g for b, g in zip(v, gain)] for c, v in base.items()}
    runs = {"fedavg": _client_runs(base), "fca": _client_runs(method)}
    found = _found(
        {"fedavg": {"final.global.acc": [0.7] * 5}, "fca": {"final.global.acc": [0.7] * 5}}
    )
    tested, _ = page.paired_numbers(_method(page.Claim("client.acc")), found, runs, "fca", "fedavg")
    assert all(t.d["significant"] for t in tested)  # unadjusted: every client "gains"
    assert all(t.p_holm > 0.05 for t in tested)  # Holm over six clients: none does
    verdict, said = page.judge(_method(page.Claim("client.acc")), found, runs, seeds)
    assert verdict == "not reproduced" and "0 of 6 clients gain significantly" in said[0]
    assert "Holm-adjusted over the 6 clients" in said[0]


def test_a_per_client_claim_gets_a_headroom_line_per_client():
    """FedHelp's claim is per client: pooled minus the baseline is measured client by client
    (before, per_seed returned None for it and the section had no headroom line)."""
    base = {"c0": [0.80, 0.81, 0.79, 0.80, 0.80], "c1": [0.50, 0.52, 0.48, 0.50, 0.51]}
    pooled = {"c0": [0.90, 0.92, 0.89, 0.91, 0.90], "c1": [0.50, 0.51, 0.49, 0.50, 0.50]}
    runs = {"fedavg": _client_runs(base), "pooled": _client_runs(pooled)}
    found = _found(
        {"fedavg": {"final.global.acc": [0.7] * 5}, "pooled": {"final.global.acc": [0.7] * 5}}
    )
    claim = _method(page.Claim("client.acc"))
    assert page.per_seed(found, "pooled", "client.acc.c0", runs) == pooled["c0"]
    said = page.headroom(claim, found, runs)[0]
    assert "c0's test acc, pooled minus fedavg: +0.1040" in said
    assert "above the baseline beyond seed noise on c0's test acc" in said
    assert "It is not on c1's test acc" in said
    assert page.gap_table(claim, found, runs) == {"client.acc.c0": True, "client.acc.c1": False}


def test_no_headroom_or_unconverged_curves_make_a_failed_claim_inconclusive():
    seeds = [0, 1, 2, 3, 4]
    base = [0.5, 0.52, 0.49, 0.51, 0.5]
    noise = [0.6, 0.4, 0.55, 0.45, 0.5]
    above = [0.6, 0.61, 0.6, 0.62, 0.6]
    method = _method(page.Claim("final.global.bacc"), page.Claim("final.clients_mean.bacc"))
    table = {
        "fedavg": {"final.global.bacc": base, "final.clients_mean.bacc": base},
        "fca": {"final.global.bacc": noise, "final.clients_mean.bacc": noise},
        # a gap on the global number only: there the null result says the method failed
        "pooled": {"final.global.bacc": above, "final.clients_mean.bacc": base},
    }
    verdict, said = page.judge(method, _found(table), {}, seeds)
    assert verdict == "not reproduced"
    assert said[0].endswith("**not reproduced** (no difference beyond seed noise on global bACC).")
    assert "**inconclusive** (no headroom where it failed" in said[1]
    no_gap = {**table, "pooled": {"final.global.bacc": base, "final.clients_mean.bacc": base}}
    assert page.judge(method, _found(no_gap), {}, seeds)[0] == "inconclusive"
    moving = _found(table)
    moving.convergence = {"fedavg": {"converged": True}, "fca": {"converged": False}}
    verdict, said = page.judge(method, moving, {}, seeds)
    assert verdict == "inconclusive" and "did not converge" in said[0]


def test_fcas_headroom_is_measured_on_generalisation_only():
    """pooled bounds the global model on the pooled test set (G), not a personalised head on
    its own client's test set (S): the G&S claim's headroom is pooled minus the baseline on G."""
    base = {"final.global.bacc": [0.5, 0.52, 0.49, 0.51, 0.5], "final.clients_mean.bacc": [0.7] * 5}
    pooled = {
        "final.global.bacc": [0.6, 0.61, 0.6, 0.62, 0.6],  # above on G
        "final.clients_mean.bacc": [0.5] * 5,  # far below on S: does not count
    }
    said = page.headroom(_method(page.Claim("gs.bacc")), _found({"fedavg": base, "pooled": pooled}))
    assert said[0].startswith("**Headroom.** its generalisation part (G: global bacc), pooled")
    assert "there is a federated gap there" in said[0] and "nothing here bounds S" in said[0]


def test_the_cost_sums_every_runs_training_time_but_shared_ones():
    runs = {
        "fedavg": [Results({"final": {"wall_seconds": 1800.0}})] * 2,
        "fca": [Results({"final": {"wall_seconds": 3600.0}})] * 2,
    }
    assert page.cost(runs) == pytest.approx(3.0)
    assert page.cost(runs, ["fedavg"]) == pytest.approx(2.0)


def _run(final, clients=("c0", "c1")):
    return Results({"task": {"client_ids": list(clients)}, "final": final})


def test_fcas_mechanism_compares_both_heads_on_every_clients_test_set(tmp_path):
    def final(fed, own):
        return {
            "global": {"bacc": 0.5},
            "clients_mean": {"bacc": (own[0] + own[1]) / 2},
            "views": {
                "global": {"clients": {"c0": {"bacc": fed[0]}, "c1": {"bacc": fed[1]}}},
                "personal": {"clients": {"c0": {"bacc": own[0]}, "c1": {"bacc": own[1]}}},
            },
        }

    fca = [final((0.5, 0.5), (0.7 + 0.01 * s, 0.5 + 0.01 * (s % 2))) for s in range(5)]
    runs = {"fedavg": [_run(final((0.5, 0.5), (0.5, 0.5)))] * 5, "fca": [_run(f) for f in fca]}
    lines = page.fca_heads(_method(page.Claim("gs.bacc")), runs, tmp_path)
    assert "personalised head is better in 1 of 2 clients" in lines[0]
    assert "| c0 | 0.5000 ± 0.0000 | 0.7200 ± 0.0141 | +0.2200 |" in lines[2]


def test_fed_lwr_and_fed_mas_mechanisms_read_what_the_runs_recorded(tmp_path):
    lwr = page.Method("Fed-LWR", "x", "", "", "c.yaml", "fedavg", "fed-lwr", ())
    summary = {"fed-lwr.uniform_share_all": 0.81, "fed-lwr.max_dev": 0.01}
    lines = page.fedlwr_weights(lwr, {"fed-lwr": [_run({"summary": summary})] * 3}, tmp_path)
    assert "0.8100 ± 0.0000" in lines[0] and "switched off in most layers" in lines[0]


def test_fed_mas_mechanism_sets_its_weights_beside_the_data_and_the_class_counts(
    tmp_path, monkeypatch
):
    from fedkit_core.testing import tiny

    monkeypatch.chdir(tmp_path)  # the figure goes to docs/figures/results under it
    mas = page.Method("Fed-MAS", "x", "", "", "c.yaml", "fedavg", "fed-mas", ())

    def summary(w0):
        return {
            "fed-mas.weight.c0": w0,
            "fed-mas.weight.c1": 1 - w0,
            "fed-mas.size_share.c0": 0.9,
            "fed-mas.size_share.c1": 0.1,
            "fed-mas.tv_from_size_mean": 0.4,
        }

    config = tiny(task={"sites": 2})  # both sites hold every class
    config = {**config, "plugins": ["fed-mas"], "fed-mas": {"rf": "normalised"}}
    ids = [f"site{i}" for i in range(2)]
    rounds = [{"round": k, "summary": summary(w)} for k, w in ((1, 0.6), (2, 0.5))]
    run = Results({"task": {"client_ids": ids}, "config": config, "rounds": rounds, "final": {}})
    run["final"]["summary"] = {
        k.replace("c0", ids[0]).replace("c1", ids[1]): v for k, v in summary(0.5).items()
    }
    for rec in rounds:
        rec["summary"] = {
            k.replace("c0", ids[0]).replace("c1", ids[1]): v for k, v in rec["summary"].items()
        }
    lines = page.fedmas_weights(mas, {"fed-mas": [run] * 2}, tmp_path)
    assert "0.4000 ± 0.0000" in lines[0]
    assert "1/K normalised: 0.0000" in lines[2]  # 0.5 each, and both hold every class
    assert f"| {ids[0]} | 0.5000 ± 0.0000 | 0.500 - 0.600 | 0.9000 ± 0.0000 |" in lines[4]

    def scored(run: Results, values) -> Results:  # each client's final test bACC
        clients = {cid: {"bacc": v} for cid, v in zip(ids, values)}
        task = {"client_ids": ids, "main_metric": "bacc"}
        return Results({**run, "task": task, "final": {**run["final"], "clients": clients}})

    runs = {"fed-mas": [scored(run, (0.4, 0.5))] * 2, "fedavg": [scored(run, (0.6, 0.45))] * 2}
    lines = page.fedmas_weights(mas, runs, tmp_path)
    # site0 loses 0.4 of weight against its share and 0.2 of bACC; site1 gains both
    assert "have Spearman +1.00 over the 2 clients" in lines[2]
    assert f"the client MAS cuts most, {ids[0]} (-0.400), changes by -0.200" in lines[2]
    assert lines[4].splitlines()[2].endswith("| -0.200 |")
    assert (tmp_path / page.FIGURES / "x-weights-normalised.png").is_file()
    assert "the authors' normalised rescue factor" in lines[0]

    # the paper's Eq. 3 (the default) beside the normalised factor's runs
    raw_config = {**config, "fed-mas": {"rf": "raw"}}
    raw = Results({**run, "config": raw_config})
    raw["final"] = {**run["final"], "summary": {**run["final"]["summary"]}}
    raw["final"]["summary"][f"fed-mas.weight.{ids[0]}"] = 0.8
    raw["final"]["summary"][f"fed-mas.weight.{ids[1]}"] = 0.2
    variant = page.Method("Fed-MAS", "x", "", "", "c.yaml", "fed-mas", "raw.yaml", ())
    lines = page.fedmas_weights(variant, {"fed-mas": [run] * 2, "raw.yaml": [raw] * 2}, tmp_path)
    assert "paper's Eq. 3 as printed" in lines[0]
    assert "under the two rescue factors (seed means): 0.3000" in lines[2]  # 0.8 against 0.5
    assert "1/K normalised: 0.3000" in lines[2]
    assert (tmp_path / page.FIGURES / "x-weights.png").is_file()


def test_fedcbs_mechanism_gives_the_per_round_paired_difference(tmp_path):
    def run(curve, cos):
        rounds = [{"round": k, "val": {"global": {"acc": v}}} for k, v in enumerate(curve, 1)]
        return Results({"rounds": rounds, "final": {"summary": cos}})

    cos = {"fedcb.mean_cos": 0.9, "fedcb.min_cos": 0.8, "fedcb.max_cos": 0.95}
    runs = {
        "fedavg": [run([0.5, 0.5, 0.5, 0.5, 0.5], {})] * 2,
        "fedcb": [run([0.6, 0.55, 0.5, 0.5, 0.49], cos)] * 2,
    }
    method = page.Method(
        "FedCB", "x", "", "", "c.yaml", "fedavg", "fedcb", (page.Claim("best.global.acc"),)
    )
    assert page.round_differences(runs, "fedcb", "fedavg", "acc") == pytest.approx(
        {1: 0.1, 2: 0.05, 3: 0.0, 4: 0.0, 5: -0.01}
    )
    text = page.fedcb_geometry(method, runs, tmp_path)[0]
    assert "`fedcb`: mean pairwise cosine 0.900 (0.800 to 0.950)" in text
    assert "above 0 in 2 of 5 evaluated rounds, largest +0.1000 (round 1)" in text
    assert "mean over the last fifth -0.0100" in text


def test_an_unknown_section_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        page.main(["--only", "fca,nope"])
    assert "unknown sections ['nope']" in capsys.readouterr().err


def test_by_default_each_section_runs_its_own_seeds_and_references(tmp_path, monkeypatch):
    """`python benchmarks/results_page.py --jobs 2` regenerates the page as it stands: the
    sections whose runs cost hours here keep their 3 seeds and skip pooled and solo."""
    called = {}

    def section(item, quick, seeds, out, jobs, references, executor, ablations):
        called[item.slug] = (list(seeds), references)
        return [], {"method": item.name, "cost (h)": "0"}

    def outside(item, quick, seeds, out, jobs, executor):
        called[item.slug] = (list(seeds), None)
        return [], {"method": item.name, "cost (h)": "0"}

    monkeypatch.setattr(page, "section", section)
    monkeypatch.setattr(page, "outside_section", outside)
    page.main(["--jobs", "2", "--out", str(tmp_path), "--page", str(tmp_path / "page.md")])
    assert called["fca"] == ([0, 1, 2, 3, 4], True)
    assert called["fed-mas"] == ([0, 1, 2], False)
    assert called["flamby"] == ([0, 1, 2], None)
    assert called["fedcb"] == ([0, 1, 2], False)
    assert called["fedhelp"] == ([0, 1, 2], True)
    assert "python benchmarks/results_page.py --jobs 2 --out" in (tmp_path / "page.md").read_text()

    page.main(
        ["--seeds", "0,1", "--seeds-of", "fca=3,4", "--references", "fedcb",
         "--no-references", "fca", "--out", str(tmp_path), "--page", str(tmp_path / "p.md")]
    )  # fmt: skip
    assert called["fca"] == ([3, 4], False)
    assert called["fed-mas"] == ([0, 1], False)
    assert called["fedcb"] == ([0, 1], True)


def test_a_section_run_without_its_ablations_names_them():
    fedcb = next(m for m in page.SECTIONS if m.slug == "fedcb")
    lines = page.unrun_ablations(fedcb)
    assert "--no-ablations" in lines[0] and fedcb.ablations[0].question in lines[0]
    assert page.unrun_ablations(next(m for m in page.SECTIONS if m.slug == "fedcb-0.1")) == []


def test_fedhelps_mechanism_says_what_each_api_knows_of_the_public_labels(tmp_path):
    knowledge = pytest.importorskip("fedkit_priors.knowledge")
    probs = np.zeros((4, 2, 2), dtype=np.float32)
    probs[:, 0, :] = [[0.9, 0.1], [0.9, 0.1], [0.1, 0.9], [0.1, 0.9]]  # right on all four
    probs[:, 1, :] = [[0.9, 0.1]] * 4  # always class 0: right on half
    found = knowledge.Knowledge(
        np.zeros((4, 8, 8, 3), np.uint8), probs, np.array([0, 0, 1, 1]), ["a@w.th", "b"], ["x", "y"]
    )
    knowledge.save_knowledge(found, tmp_path / "k.npz")
    (tmp_path / "c.yaml").write_text(f"fedhelp: {{knowledge: {tmp_path / 'k.npz'}}}\n")
    fedhelp = next(m for m in page.SECTIONS if m.slug == "fedhelp")
    text = page.api_knowledge(page.replace(fedhelp, config=str(tmp_path / "c.yaml")))
    assert "2 classes (x, y)" in text
    assert "`a` acc 1.000, bACC 1.000" in text and "`b` acc 0.500, bACC 0.500" in text
    assert "`a` and `b` on 50.0% of them" in text
    (tmp_path / "k.npz").unlink()
    assert "No knowledge file" in page.api_knowledge(
        page.replace(fedhelp, config=str(tmp_path / "c.yaml"))
    )
