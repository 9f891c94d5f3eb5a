"""The paper's table (Table 4) from a ``fedkit compare`` directory, for every runspec.

Generalisation (G) is ``final.global`` (the global model on the pooled test set),
specialisation (S) is ``final.clients_mean`` (each client's model on its own test set: the
personalised head for FCA, or its locally trained model before aggregation with
``fca.specialisation=authors_code``; the global model for FedAvg), and G&S is their mean, computed
per seed and then summarised as mean ± std over seeds (ddof 0, as ``fedkit compare``).
FCA runs also carry G&S in ``final.summary``; this table gives it to the baselines too.

    python -m fedkit_fca.gs runs/fca-retinamnist        # prints and writes gs.md there
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.plugin import FedkitError, markdown_table

METRICS = ("bacc", "bauc")
PARTS = ("G", "S", "G&S")


def gs_table(
    compare: Mapping[str, Mapping[str, Any]], metrics: Sequence[str] = METRICS
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{runspec: {"<part> <metric>": {mean, std, per_seed}}}`` from ``compare.json``."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for spec, row in compare.items():
        if spec == "diff":  # compare's paired differences against the baseline, not a runspec
            continue
        cells: dict[str, dict[str, Any]] = {}
        for m in metrics:
            g_key, s_key = f"final.global.{m}", f"final.clients_mean.{m}"
            if g_key not in row or s_key not in row:
                raise FedkitError(f"{spec}: compare.json has no {g_key} / {s_key}")
            g = np.asarray(row[g_key]["per_seed"], dtype=float)
            s = np.asarray(row[s_key]["per_seed"], dtype=float)
            for part, values in zip(PARTS, (g, s, (g + s) / 2)):
                cells[f"{part} {m}"] = {
                    "mean": float(values.mean()),
                    "std": float(values.std()),
                    "per_seed": values.tolist(),
                }
        table[spec] = cells
    return table


def markdown(table: Mapping[str, Mapping[str, Mapping[str, Any]]], percent: bool = True) -> str:
    """The table as markdown, in percent like the paper."""
    columns = list(next(iter(table.values())))
    return markdown_table(table, columns, scale=100.0 if percent else 1.0, digits=1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("compare_dir", type=Path, help="a `fedkit compare --out` directory")
    parser.add_argument("--metrics", default=",".join(METRICS), help="comma-separated metrics")
    args = parser.parse_args(argv)
    path = args.compare_dir / "compare.json"
    if not path.is_file():
        raise SystemExit(f"{path} not found: run `fedkit compare ... --out {args.compare_dir}`")
    table = gs_table(json.loads(path.read_text()), args.metrics.split(","))
    text = markdown(table)
    seeds = len(next(iter(next(iter(table.values())).values()))["per_seed"])
    text = f"Mean ± std over {seeds} seeds, in %.\n\n" + text
    (args.compare_dir / "gs.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
