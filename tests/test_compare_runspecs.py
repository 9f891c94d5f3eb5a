"""`fedkit compare`: the config layers each runspec gets."""

import pytest

from fedkit_core import comparison
from fedkit_core.results import compare, markdown_table


def test_plugin_keys_of_the_shared_config_and_sets_reach_only_runspecs_using_the_plugin(
    monkeypatch,
):
    monkeypatch.setattr(compare, "installed", lambda: {"meth": None, "other": None})
    shared = {"plugins": ["meth"], "rounds": 7, "meth": {"alpha": 2}, "other.beta": 1}
    sets = {"lr": 0.1, "meth.alpha": 3}

    fedavg = compare.runspec_layers("fedavg", [shared], sets)
    assert fedavg == [{"plugins": ["meth"], "rounds": 7}, {"plugins": []}, {"lr": 0.1}]

    both = compare.runspec_layers("meth+other", [shared], sets)
    assert both[0] == shared and both[1] == {"plugins": ["meth", "other"]}
    assert both[2] == sets


def test_console_rows_put_runspecs_side_by_side():
    entry = {"mean": 0.5, "std": 0.25, "per_seed": [0.25, 0.75]}
    table = {
        "fedavg": {
            "final.global.bacc": entry,
            "final.fairness.std": entry,
            "best.global.bacc": entry,
        },
        "fca": {"final.global.bacc": entry, "final.fairness.std": entry, "best.global.bacc": entry},
    }
    rows = compare.Comparison(table, "bacc", [0, 1]).rows()
    assert [r["metric"] for r in rows] == [
        "global bACC",
        "fairness std",
        "global bACC, best val round",
    ]
    assert rows[0]["fedavg"] == rows[0]["fca"] == "0.5000 ± 0.2500"
    assert compare.metric_label("final.clients_mean.dice") == "clients mean Dice"
    assert compare.metric_label("final.summary.fca.gs_bacc") == "fca gs bACC"


def test_markdown_table_scales_and_rounds():
    table = {"fca": {"G bacc": {"mean": 0.3625, "std": 0.019}}}
    text = markdown_table(table, ["G bacc"], scale=100.0, digits=1)
    assert text.splitlines() == ["| runspec | G bacc |", "|---|---|", "| fca | 36.2 ± 1.9 |"]


def test_the_batch_norm_policy_of_each_runspec_is_stated():
    entry = {"mean": 0.5, "std": 0.25, "per_seed": [0.25, 0.75]}
    table = {"fedavg": {"final.global.bacc": entry}, "fedbn": {"final.global.bacc": entry}}
    bn = {"fedavg": "average", "fedbn": "local"}
    rows = compare.Comparison(table, "bacc", [0, 1], bn=bn).rows()
    assert rows[-1] == {"metric": "batch norm", "fedavg": "average", "fedbn": "local"}
    note = compare.notes(table, "bacc", [0, 1], {"fedavg": "global", "fedbn": "global"}, bn=bn)[-1]
    assert note.startswith("Batch norm: fedavg: averaged with the model")
    assert "fedbn: kept on each client" in note
    assert compare.bn_policy({"final": {}}) == "unknown"  # results written before it existed


def test_a_runspec_given_twice_or_two_sharing_a_folder_is_refused(tmp_path):
    import pytest

    from fedkit_core import FedkitError
    from fedkit_core.testing import tiny

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.yaml").write_text("rounds: 1\n")
    for specs in (["fedavg", "fedavg"], [f"{tmp_path}/a/x.yaml", f"{tmp_path}/b/x.yaml"]):
        with pytest.raises(FedkitError, match="given twice or sharing a folder"):
            comparison.compare(specs, seeds=[0], out=tmp_path / "cmp", base=[tiny(rounds=1)])
    assert not (tmp_path / "cmp").exists()  # refused before anything ran


def test_runspec_labels_and_run_names_stay_inside_their_folder(tmp_path, monkeypatch):
    from fedkit_core.results.store import default_out

    assert compare.runspec_label("...yaml") == "__"  # its stem is "..": the parent folder
    assert compare.runspec_label("x/../../evil") == "x_.._.._evil"
    monkeypatch.chdir(tmp_path)
    made = default_out({"name": "../../../X", "plugins": [], "task.name": "synthetic"})
    assert made.resolve().parent == tmp_path / "runs" and made.name.startswith(".._.._.._X-")


@pytest.mark.slow
def test_runspecs_that_are_not_paired_are_refused_before_anything_runs(tmp_path):
    import json

    import pytest
    import yaml

    from fedkit_core import FedkitError
    from fedkit_core.testing import tiny

    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"partition": {"kind": "dirichlet", "alpha": 0.1}}))
    specs = ["fedavg", str(other)]
    with pytest.raises(FedkitError, match=r"not paired.*partition\.alpha.*--allow-unpaired"):
        comparison.compare(specs, seeds=[0], out=tmp_path / "cmp", base=[tiny(rounds=1)])
    assert not (tmp_path / "cmp").exists()

    found = comparison.compare(
        specs, seeds=[0], out=tmp_path / "cmp", base=[tiny(rounds=1)], allow_unpaired=True
    )
    assert any("partition.alpha" in w for w in found.warnings)
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["warnings"] and "partition.alpha" in saved["warnings"][0]
    assert (tmp_path / "cmp" / "compare.md").read_text().startswith("**Warning: not paired.**")


@pytest.mark.slow
def test_command_line_flags_win_over_a_runspec_file_as_set_does(tmp_path, capsys):
    import json

    import yaml

    from fedkit_core.cli import main
    from fedkit_core.testing import tiny

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(tiny(rounds=1)))
    spec = tmp_path / "spec.yaml"  # a runspec file as examples ship them: its own size
    spec.write_text(yaml.safe_dump({"rounds": 3, "clients": 2}))
    out = tmp_path / "cmp"
    args = ["compare", "fedavg", str(spec), "--config", str(base), "--seeds", "0", "-q"]
    assert main([*args, "--out", str(out)]) == 2  # all 3 sites against the file's 2 clients
    err = capsys.readouterr().err
    assert "not paired" in err and "clients: fedavg default" in err
    assert main([*args, "--clients", "3", "--rounds", "2", "--out", str(out)]) == 0
    for label in ("fedavg", "spec"):
        results = json.loads((out / label / "seed0" / "results.json").read_text())
        assert results["config"]["clients"] == 3 and len(results["rounds"]) == 2


def _run(seed: int, bacc: float, environment: dict | None = None) -> dict:
    """A finished run's results.json, as little of it as ``compare`` reads."""
    scopes = {"global": {"bacc": bacc}, "clients": {"a": {"bacc": bacc}}}
    scopes["clients_mean"] = {"bacc": bacc}
    return {
        "config": {"plugins": [], "seed": seed},
        "task": {"client_ids": ["a"], "main_metric": "bacc", "name": "t"},
        "rounds": [{"round": 1, "evaluated": ["val", "test"], **scopes, "val": scopes}],
        "final": {"round": 1, **scopes, "summary": {}, "views": {}, "wall_seconds": 1.0},
        **({"environment": environment} if environment else {}),
    }


def test_runs_of_different_environments_are_named_in_a_warning(tmp_path):
    """Paired runs recorded under other threads or torch versions are compared with a warning
    that names the key and the runs (the same seed repeats bit for bit in one environment
    only); runs without the record, and runs that agree, raise none."""
    import json

    env = {"torch": "2.14.1", "numpy": "2.4.6", "python": "3.11.7", "threads": 1}
    scores = {"fedavg": (0.5, 0.6, 0.55, 0.52), "fca": (0.55, 0.6, 0.6, 0.5)}
    bare = {spec: [_run(s, v) for s, v in enumerate(vs)] for spec, vs in scores.items()}
    assert compare.environment_differences(bare) == []  # not recorded: nothing to compare
    runs = {spec: [_run(s, v, dict(env)) for s, v in enumerate(vs)] for spec, vs in scores.items()}
    assert compare.environment_differences(runs) == []
    runs["fca"][1]["environment"]["threads"] = 2
    assert compare.environment_differences(runs) == [
        "threads: 1 (fedavg seed 0, fedavg seed 1, fedavg seed 2, ...); 2 (fca seed 1)"
    ]

    found = comparison.compare(
        list(runs), seeds=range(4), out=tmp_path, run_one=lambda _l, _p, spec, s: runs[spec][s]
    )
    assert found.environments and not found.warnings
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["warnings"] == [f"{compare.ENVIRONMENTS_DIFFER}: {found.environments[0]}"]
    assert (
        (tmp_path / "compare.md")
        .read_text()
        .startswith(f"**Warning: {compare.ENVIRONMENTS_DIFFER}.** threads: 1")
    )
