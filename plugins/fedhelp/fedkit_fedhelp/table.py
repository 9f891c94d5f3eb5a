"""Per-client table of `fedkit compare fedavg fedhelp` runs (one compare folder per seed or
one with several seeds): bACC per client (mean ± std over seeds, the population std as
`fedkit compare` prints it), the paired gain (seed by seed) with a 95% t interval, fairness
and the first round's bytes.

    python -m fedkit_fedhelp.table runs/fedhelp-pneumonia
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

METHODS = ("fedavg", "fedhelp")


def _runs(root: Path, method: str) -> dict[str, dict]:
    """The complete runs of ``method`` under ``root`` by seed folder (``seed0``, ...)."""
    runs = {
        f.parent.name: json.loads(f.read_text())
        for f in root.glob(f"**/{method}/seed*/results.json")
    }
    return {seed: r for seed, r in sorted(runs.items()) if r.get("status") == "complete"}


def table(root: Path) -> str:
    found = {m: _runs(root, m) for m in METHODS}
    paired = sorted(set(found["fedavg"]) & set(found["fedhelp"]))
    if len(paired) < 2:
        counts = [len(r) for r in found.values()]
        return f"{root}: complete runs per method {counts}, {len(paired)} seeds paired; need 2+"
    runs = {m: [found[m][seed] for seed in paired] for m in METHODS}
    seeds = len(paired)
    lines = [
        f"{seeds} seeds, client bACC (served model), mean ± std; gain: paired, 95% t interval",
        "| client | FedAvg | FedHelp | gain |",
        "|---|---|---|---|",
    ]
    for cid in sorted(runs["fedavg"][0]["final"]["clients"]):
        a, b = ([r["final"]["clients"][cid]["bacc"] for r in runs[m]] for m in METHODS)
        d = np.array(b) - np.array(a)
        half = stats.t.ppf(0.975, seeds - 1) * d.std(ddof=1) / np.sqrt(seeds)
        lines.append(
            f"| {cid} | {np.mean(a):.3f} ± {np.std(a):.3f} | {np.mean(b):.3f} ± {np.std(b):.3f} | "
            f"{d.mean():+.3f} [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}] |"
        )
    for key in ("std", "worst"):
        parts = [
            f"{m} {np.mean(v):.3f} ± {np.std(v):.3f}"
            for m in METHODS
            for v in [[r["final"]["fairness"][key] for r in runs[m]]]
        ]
        lines.append(f"fairness.{key}: " + ", ".join(parts))
    for m in METHODS:
        rec = runs[m][0]["rounds"][0]["bytes"]
        lines.append(f"{m} round-1 bytes: {sum(v['down'] + v['up'] for v in rec.values())}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
