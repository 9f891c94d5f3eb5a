"""The per-client table reads complete runs of both methods and pairs them by seed."""

import json

from fedkit_fedhelp.table import table


def write(root, method, seed, bacc):
    folder = root / f"seed{seed}" / method / f"seed{seed}"
    folder.mkdir(parents=True)
    clients = {"c0": {"bacc": bacc}, "c1": {"bacc": bacc - 0.1}}
    final = {"clients": clients, "fairness": {"std": 0.05, "worst": bacc - 0.1}}
    rounds = [{"bytes": {"c0": {"down": 10, "up": 5}, "c1": {"down": 10, "up": 5}}}]
    results = {"status": "complete", "final": final, "rounds": rounds}
    (folder / "results.json").write_text(json.dumps(results))


def test_table_pairs_seeds_and_reports_gain(tmp_path):
    for seed, (a, b) in enumerate([(0.6, 0.7), (0.62, 0.7), (0.58, 0.71)]):
        write(tmp_path, "fedavg", seed, a)
        write(tmp_path, "fedhelp", seed, b)
    text = table(tmp_path)
    assert "3 seeds" in text and "| c0 | 0.600 ± 0.016 | 0.703 ± 0.005 | +0.103" in text
    assert "fedavg round-1 bytes: 30" in text
    (tmp_path / "seed1" / "fedhelp" / "seed1" / "results.json").unlink()
    text = table(tmp_path)  # seeds 0 and 2 are paired, not the first two of each method
    assert "2 seeds" in text and "| c0 | 0.590 ± 0.010 | 0.705 ± 0.005 | +0.115" in text
