"""The G / S / G&S table built from a compare.json, checked by hand."""

import json

import pytest
from fedkit_fca import gs


def row(g, s):
    return {
        "final.global.bacc": {"per_seed": g},
        "final.clients_mean.bacc": {"per_seed": s},
    }


def test_gs_is_the_per_seed_mean_of_global_and_clients_mean():
    table = gs.gs_table({"fca": row([0.6, 0.8], [0.7, 0.5])}, ["bacc"])["fca"]
    assert table["G bacc"]["mean"] == pytest.approx(0.7)
    assert table["G bacc"]["std"] == pytest.approx(0.1)  # ddof 0
    assert table["S bacc"]["mean"] == pytest.approx(0.6)
    assert table["G&S bacc"]["per_seed"] == pytest.approx([0.65, 0.65])
    assert table["G&S bacc"]["std"] == pytest.approx(0.0)


def test_cli_writes_gs_md(tmp_path, capsys):
    compare = {"fedavg": row([0.5, 0.5], [0.4, 0.6]), "fca": row([0.6, 0.6], [0.7, 0.7])}
    compare["diff"] = {"fca": {"final.global.bacc": {"mean": 0.1}}}  # compare's paired section
    (tmp_path / "compare.json").write_text(json.dumps(compare))
    gs.main([str(tmp_path), "--metrics", "bacc"])
    text = (tmp_path / "gs.md").read_text()
    assert "| fca | 60.0 ± 0.0 | 70.0 ± 0.0 | 65.0 ± 0.0 |" in text
    assert "| fedavg | 50.0 ± 0.0 | 50.0 ± 10.0 | 50.0 ± 5.0 |" in text
    assert capsys.readouterr().out == text
