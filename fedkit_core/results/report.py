"""``fedkit report``: re-plot and summarise one or several run directories."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fedkit_core.errors import FedkitError
from fedkit_core.results.plots import (
    _title,
    figure_formats,
    figure_paths,
    figure_target,
    plot_run,
    plot_runs,
)
from fedkit_core.results.schema import Results
from fedkit_core.results.store import note_written, refuse_foreign, writable

T = TypeVar("T")


def run_labels(dirs: Sequence[str | Path], runs: Sequence[Results]) -> list[str]:
    """Each run's label in a report: its name (:func:`_title`: method, task, model,
    aggregation mode, DP level) and seed, and its folder's name where that still leaves two
    alike, so that no two rows or lines of a report read the same."""
    labels = [f"{_title(r)} seed {r['config'].get('seed')}" for r in runs]
    return [
        f"{label} [{Path(d).name}]" if labels.count(label) > 1 else label
        for d, label in zip(dirs, labels)
    ]


def summary_row(results: Results, label: str | None = None) -> dict[str, Any]:
    """The headline numbers of one run (under ``label``, default its name): the main metric
    of the final global model (pooled test) and its mean, std and worst value across
    clients, the round best on validation and the global test value there."""
    main = results.main_metric
    final = results.final
    fair = final.get("fairness", {})
    best = final.get("best", {})
    status = "" if results["status"] == "complete" else f" ({results['status']})"
    return {
        "run": (label or _title(results)) + status,
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
    dirs: Sequence[str | Path],
    overlay: Path | None = None,
    formats: Sequence[str] | None = None,
) -> tuple[list[dict[str, Any]], list[Path], list[str]]:
    """Re-plot every run in its own directory; with several runs, also an overlay figure
    (default ``report.png`` in the runs' common folder, never the current one; a file there
    that fedkit did not write is refused, never overwritten). Figures in
    ``formats`` (default: each run's ``figure_formats``, the overlay the first run's). Returns
    the summary rows, the figures written and notes: a run folder that cannot be written
    (read-only) is summarised with its figures left as they are, and an overlay that
    cannot be written is skipped, each with a note saying so."""
    runs = [Results.load(d) for d in dirs]
    plots: list[Path] = []
    notes: list[str] = []
    labels = readable("the runs", run_labels, dirs, runs)
    rows = [readable(d, summary_row, r, label) for d, r, label in zip(dirs, runs, labels)]
    for directory, results in zip(dirs, runs):
        if not writable(Path(directory)):
            notes.append(f"{directory} is read-only: its figures are left as they are")
            continue
        plots += readable(directory, plot_run, results, Path(directory), formats)
    if len(runs) > 1:
        common = Path(os.path.commonpath([os.path.abspath(d) for d in dirs]))
        target = figure_target(overlay, "report") if overlay else common / "report.png"
        if writable(target.parent):
            shared = formats or figure_formats(runs[0]["config"])
            files = figure_paths(target, shared)
            # the runs' folder is not fedkit's: only its own earlier overlay is replaced
            # there (a file the user named with --out is theirs to replace)
            refuse_foreign([f for f in files if overlay is None or f != Path(overlay)], "--out")
            plots.append(readable("the runs", plot_runs, runs, labels, target, shared))
            note_written(files)
        else:
            notes.append(
                f"{target.parent} is read-only: no overlay figure (give --out a writable place)"
            )
    return rows, plots, notes


def readable(where: Any, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on the results of ``where``; a damaged or foreign results.json
    (keys missing, values of the wrong type) becomes one clear error naming it."""
    try:
        return function(*args)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise FedkitError(
            f"the results of {where} cannot be read: damaged, or not written by fedkit "
            f"({type(err).__name__}: {str(err)[:200]})"
        ) from None
