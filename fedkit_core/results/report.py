"""``fedkit report``: re-plot and summarise one or several run directories."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedkit_core.results.plots import _title, figure_target, plot_run, plot_runs
from fedkit_core.results.schema import Results


def summary_row(results: Results) -> dict[str, Any]:
    """The headline numbers of one run: the main metric of the final global model (pooled
    test) and its mean, std and worst value across clients, the round best on validation
    and the global test value there."""
    main = results.main_metric
    final = results.final
    fair = final.get("fairness", {})
    best = final.get("best", {})
    status = "" if results["status"] == "complete" else f" ({results['status']})"
    return {
        "run": _title(results) + status,
        "rounds": final.get("round"),
        main: final.get("global", {}).get(main),
        "clients": final.get("clients_mean", {}).get(main),
        "std": fair.get("std"),
        "worst": fair.get("worst"),
        "best rd": best.get("round"),
        "at best": best.get("global", {}).get(main),
        "wall s": None if final.get("wall_seconds") is None else round(final["wall_seconds"]),
    }


def report(
    dirs: Sequence[str | Path], overlay: Path | None = None
) -> tuple[list[dict[str, Any]], list[Path]]:
    """Re-plot every run in its own directory; with several runs, also an overlay figure
    (default ``report.png`` in the runs' common folder, never the current one)."""
    runs = [Results.load(d) for d in dirs]
    plots: list[Path] = []
    for directory, results in zip(dirs, runs):
        plots += plot_run(results, Path(directory))
    if len(runs) > 1:
        labels = [f"{_title(r)} ({Path(d).name})" for d, r in zip(dirs, runs)]
        common = Path(os.path.commonpath([os.path.abspath(d) for d in dirs]))
        target = figure_target(overlay, "report") if overlay else common / "report.png"
        plots.append(plot_runs(runs, labels, target))
    return [summary_row(r) for r in runs], plots
