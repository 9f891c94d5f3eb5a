"""Per-client scores and paired gains over a reference runspec (``fedkit compare``'s
``clients`` section), checked by hand on fabricated results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedkit_core.comparison import compare
from fedkit_core.errors import FedkitError
from fedkit_core.results import clients as per_client
from fedkit_core.results.compare import reference_labels
from fedkit_core.results.labels import method_label, reference_of

T_975_2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom


def fake(clients: dict[str, float | None], plugins=(), pooled=False, ids=None) -> dict:
    """A run's results: its final per-client bACC (``None``: the client was not scored)."""
    scored = {cid: {"bacc": v} for cid, v in clients.items() if v is not None}
    mean = {"bacc": float(np.mean([m["bacc"] for m in scored.values()]))}
    values = [m["bacc"] for m in scored.values()]
    fairness = {"metric": "bacc", "std": float(np.std(values)), "worst": min(values)}
    glob = {} if "solo" in plugins else {"bacc": mean["bacc"] + 0.01}
    scopes = {"global": glob, "clients": scored, "clients_mean": mean, "fairness": fairness}
    return {
        "config": {"plugins": list(plugins), "pooled": pooled},
        "task": {"client_ids": list(ids or clients), "main_metric": "bacc", "name": "t"},
        "rounds": [{"round": 1, "evaluated": ["val", "test"], **scopes, "val": scopes}],
        "final": {"round": 1, **scopes, "summary": {}, "views": {}, "wall_seconds": 1.0},
    }


SEEDS = [0, 1, 2]
#: bACC of clients a and b per seed
RUNS = {
    "fedavg": [
        fake({"a": 0.60, "b": 0.50}),
        fake({"a": 0.62, "b": 0.40}),
        fake({"a": 0.58, "b": 0.45}),
    ],
    "solo": [
        fake({"a": 0.55, "b": 0.52}, ["solo"]),
        fake({"a": 0.50, "b": 0.41}, ["solo"]),
        fake({"a": 0.57, "b": 0.50}, ["solo"]),
    ],
}


def test_gains_over_the_reference_match_a_hand_computation():
    section = per_client.clients_section(RUNS, "bacc", "solo", SEEDS)
    assert section["reference"] == "solo" and set(section["gains"]) == {"fedavg"}
    a = section["gains"]["fedavg"]["a"]
    d = np.array([0.60 - 0.55, 0.62 - 0.50, 0.58 - 0.57])  # 0.05, 0.12, 0.01
    assert a["per_seed"] == pytest.approx(d.tolist())
    assert a["mean"] == pytest.approx(0.06)
    sd = np.sqrt(((d - 0.06) ** 2).sum() / 2)
    half = T_975_2 * sd / np.sqrt(3)
    assert a["ci_t"] == pytest.approx([0.06 - half, 0.06 + half])
    assert (a["wins"], a["ties"], a["losses"]) == (3, 0, 0)
    assert a["significant"] is False  # the t interval ([-0.08, +0.20]) contains 0
    b = section["gains"]["fedavg"]["b"]
    assert b["per_seed"] == pytest.approx([-0.02, -0.01, -0.05])
    assert (b["wins"], b["losses"]) == (0, 3)
    scores = section["scores"]["solo"]["b"]
    assert scores["mean"] == pytest.approx(np.mean([0.52, 0.41, 0.50]))
    assert scores["std"] == pytest.approx(np.std([0.52, 0.41, 0.50]))
    assert section["missing"] == {}


def test_rows_put_clients_down_and_runspecs_across_with_the_highlighted_client_bold():
    section = per_client.clients_section(RUNS, "bacc", "solo", SEEDS)
    labels = {"solo": "solo (reference: local)"}
    rows = per_client.gain_rows(section, labels, highlight={"b"})
    assert [r["client"] for r in rows] == ["a", "**b**"]
    assert list(rows[0]) == ["client", "fedavg"]
    assert rows[0]["fedavg"].startswith("+0.0600 [") and rows[0]["fedavg"].endswith("3/0/0")
    assert rows[1]["fedavg"].startswith("**-0.0267 [")
    scores = per_client.score_rows(section, labels)
    assert list(scores[0]) == ["client", "fedavg", "solo (reference: local)"]
    assert (
        scores[0]["fedavg"]
        == f"{np.mean([0.60, 0.62, 0.58]):.4f} ± {np.std([0.60, 0.62, 0.58]):.4f}"
    )


def test_a_consistent_gain_is_marked_significant():
    runs = {
        "solo": [fake({"a": v}, ["solo"]) for v in (0.50, 0.60, 0.70)],
        "fca": [fake({"a": v}) for v in (0.60, 0.71, 0.79)],
    }
    gain = per_client.clients_section(runs, "bacc", "solo", SEEDS)["gains"]["fca"]["a"]
    assert gain["significant"] and per_client.gain_text(gain).endswith("3/0/0 *")


def test_the_reference_is_solo_when_compared_else_the_first_runspec():
    kinds = {"fedavg": None, "pooled": "pooled", "solo": "local", "fca": None}
    assert per_client.default_reference(list(kinds), kinds) == "solo"
    assert per_client.default_reference(["fedavg", "fca"], {}) == "fedavg"
    with pytest.raises(FedkitError, match="not one of the compared runspecs"):
        per_client.clients_section(RUNS, "bacc", "fca", SEEDS)


def test_a_client_missing_in_one_run_has_no_gain_there_and_a_note():
    runs = {
        **RUNS,
        "fca": [
            fake({"a": 0.61, "b": 0.49}),
            fake({"a": 0.63, "b": None}),  # b was not scored (a tolerated failure)
            fake({"a": 0.59, "b": 0.47}),
        ],
    }
    section = per_client.clients_section(runs, "bacc", "solo", SEEDS)
    assert set(section["gains"]["fca"]) == {"a"} and set(section["gains"]["fedavg"]) == {"a", "b"}
    assert section["missing"] == {"fca": {"b": [1]}}
    assert section["scores"]["fca"]["b"]["mean"] == pytest.approx(0.48)  # the seeds it has
    assert section["scores"]["fca"]["b"]["per_seed"] == [0.49, None, 0.47]
    assert any("b was not scored by fca in seed 1" in n for n in section["notes"])
    row = per_client.gain_rows(section)[1]
    assert row["client"] == "b" and row["fca"] == "-"
    # missing in the reference: no client gains for it anywhere
    runs["solo"] = [*RUNS["solo"][:2], fake({"a": 0.5, "b": None}, ["solo"])]
    section = per_client.clients_section(runs, "bacc", "solo", SEEDS)
    assert "b" not in section["gains"]["fedavg"] and section["missing"]["solo"] == {"b": [2]}


def test_one_seed_gives_differences_without_intervals_and_says_so():
    runs = {spec: seeds[:1] for spec, seeds in RUNS.items()}
    section = per_client.clients_section(runs, "bacc", "solo", [0])
    gain = section["gains"]["fedavg"]["a"]
    assert gain == {"mean": pytest.approx(0.05), "per_seed": [pytest.approx(0.05)], "seeds": 1}
    assert per_client.gain_text(gain) == "+0.0500"
    assert any("One seed" in n and "no interval" in n for n in section["notes"])
    with pytest.raises(FedkitError, match="one value per seed"):
        per_client.client_gain([0.5, 0.6], [0.5])


@pytest.mark.slow
def test_compare_tabulates_and_plots_the_references_and_the_client_gains(tmp_path):
    results = {
        "fedavg": RUNS["fedavg"],
        "pooled": [
            fake({"a": v, "b": w}, pooled=True) for v, w in ((0.7, 0.6), (0.72, 0.55), (0.69, 0.58))
        ],
        "solo": RUNS["solo"],
    }

    def run_one(layers, path, spec, seed):
        if spec == "pooled":
            assert {"plugins": [], "pooled": True} in layers  # the runspec's own layer
        return results[spec][seed]

    with pytest.raises(FedkitError, match="--reference fca is not one of"):
        compare(list(results), seeds=SEEDS, out=tmp_path, run_one=run_one, reference="fca")
    found = compare(list(results), seeds=SEEDS, out=tmp_path, run_one=run_one)
    assert found.references == {"pooled": "pooled", "solo": "local"}
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["references"] == found.references
    assert saved["clients"]["reference"] == "solo"
    assert set(saved["clients"]["gains"]) == {"fedavg", "pooled"}
    assert saved["clients"]["gains"]["pooled"]["a"]["per_seed"] == pytest.approx([0.15, 0.22, 0.12])
    assert set(saved["diff"]) == {"pooled", "solo"}  # paired differences: still to the first
    md = (tmp_path / "compare.md").read_text()
    assert "| pooled (reference: centralised) |" in md and "| solo (reference: local) |" in md
    assert "References, not methods" in md and "NOT federated" in md
    assert "Paired gain in bACC over solo (reference: local) per client" in md
    assert "| solo (reference: local) | - |" in md  # no global model: its global cell is empty
    assert (tmp_path / "compare.png").is_file() and (tmp_path / "compare-clients.png").is_file()
    # another reference: FedAvg, as FedHelp's table of each client's gain over FedAvg
    found = compare(list(results), seeds=SEEDS, out=tmp_path, run_one=run_one, reference="fedavg")
    assert set(found.clients["gains"]) == {"pooled", "solo"}
    assert found.gain_rows(highlight={"b"})[1]["client"] == "**b**"


def test_a_run_is_a_reference_by_its_config():
    assert reference_of({"pooled": True, "plugins": []}) == "pooled"
    assert reference_of({"plugins": ["solo", "focal"]}) == "local"
    assert reference_of({"plugins": ["fca"]}) is None and reference_of({"plugins": []}) is None
    assert method_label({"pooled": True, "plugins": []}) == "pooled"
    assert method_label({"plugins": []}) == "fedavg"
    assert reference_labels({"pooled": "pooled", "solo": "local"}) == {
        "pooled": "pooled (reference: centralised)",
        "solo": "solo (reference: local)",
    }
