"""``fedkit report``: re-plot and summarise one or several run directories."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedkit_core.results.plots import _title, plot_run, plot_runs
from fedkit_core.results.schema import Results


def summary_row(results: Results) -> dict[str, Any]:
    """The headline numbers of one run."""
    main = results.main_metric
    final = results.final
    fair = final.get("fairness", {})
    best = final.get("best", {})
    return {
        "run": _title(results),
        "status": results["status"],
        "rounds": final.get("round"),
        f"global {main}": final.get("global", {}).get(main),
        f"clients mean {main}": final.get("clients_mean", {}).get(main),
        "fairness std": fair.get("std"),
        "worst client": fair.get("worst"),
        "best round (val)": best.get("round"),
        f"best {main}": best.get("global", {}).get(main),
        "wall s": final.get("wall_seconds"),
    }


def report(
    dirs: Sequence[str | Path], overlay: Path | None = None
) -> tuple[list[dict[str, Any]], list[Path]]:
    """Re-plot every run in its own directory; with several runs, also an overlay figure."""
    runs = [Results.load(d) for d in dirs]
    plots: list[Path] = []
    for directory, results in zip(dirs, runs):
        plots += plot_run(results, Path(directory))
    if len(runs) > 1:
        labels = [f"{_title(r)} ({Path(d).name})" for d, r in zip(dirs, runs)]
        plots.append(plot_runs(runs, labels, overlay or Path("report.png")))
    return [summary_row(r) for r in runs], plots
