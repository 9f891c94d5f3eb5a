"""Time to a target in ``fedkit compare --target``: when each run first reached a score.

A target is ``SPLIT.SCOPE.METRIC=VALUE``: ``final.global.bacc=0.80`` is the global model's
balanced accuracy on the pooled test split (the number ``final.global.bacc`` of the compare
table) reaching 0.80, ``val.clients_mean.bacc=0.7`` the clients' mean on validation. A run's
time to the target is the time of its first evaluated round at or above the value: its
``simulated_seconds`` (runs with site profiles or another ``aggregation``, see
docs/hospitals.md), else the wall seconds of the rounds so far (``seconds``, summed), the
same clock for every run of a comparison. A run that never gets there has no time (it is
counted in the fraction of seeds that reached it, not in the mean).

Per runspec: the seeds' times, the fraction reaching the target and the mean ± std of the
times that exist; against the first runspec, the paired difference over the seeds where both
reached it (:func:`fedkit_core.metrics.paired.paired_difference`: mean, 95% intervals, wins
are seeds reached sooner). The figure draws the score against time, one line per seed, with
the target.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.errors import FedkitError
from fedkit_core.metrics.paired import paired_difference
from fedkit_core.results.labels import metric_name
from fedkit_core.results.schema import has_test

_TARGET = re.compile(r"^(final|val)\.(global|clients_mean)\.([A-Za-z0-9_.-]+)=(.+)$")


@dataclass(frozen=True)
class Target:
    """A score to reach: ``split`` (``final``: the test split; ``val``), ``scope``
    (``global``, ``clients_mean``), ``metric`` and ``value``."""

    split: str
    scope: str
    metric: str
    value: float

    @property
    def path(self) -> str:
        return f"{self.split}.{self.scope}.{self.metric}"

    @property
    def text(self) -> str:
        return f"{self.path}={self.value:g}"

    @property
    def tests(self) -> bool:
        """Whether it is a test-split score (every round must then score the test split)."""
        return self.split == "final"


def parse_target(text: str) -> Target:
    """``final.global.bacc=0.80`` as a :class:`Target`; anything else is a clear error."""
    found = _TARGET.match(text.strip())
    value = None
    if found:
        try:
            value = float(found.group(4))
        except ValueError:
            value = None
    if found is None or value is None or not np.isfinite(value):
        raise FedkitError(
            f"--target expects SPLIT.SCOPE.METRIC=VALUE with SPLIT final (test) or val and "
            f"SCOPE global or clients_mean, e.g. final.global.bacc=0.80; got {text!r}"
        )
    return Target(found.group(1), found.group(2), found.group(3), value)


def clock_of(runs: Sequence[Mapping[str, Any]]) -> str:
    """``simulated`` when every run has simulated time, else ``wall``."""
    timed = all("simulated_seconds" in r["final"] for r in runs)
    return "simulated" if timed else "wall"


def curve(results: Mapping[str, Any], target: Target, clock: str) -> list[tuple[float, float]]:
    """``(seconds, score)`` of every round of ``results`` that scored the target's metric."""
    points, elapsed = [], 0.0
    for record in results["rounds"]:
        elapsed += record.get("seconds", 0.0)
        when = record["simulated_seconds"] if clock == "simulated" else elapsed
        if target.split == "final":
            scopes = record if has_test(record) else None
        else:
            scopes = record.get("val")
        score = ((scopes or {}).get(target.scope) or {}).get(target.metric)
        if score is not None:
            points.append((float(when), float(score)))
    return points


def time_to_target(results: Mapping[str, Any], target: Target, clock: str) -> float | None:
    """Seconds until the first round at or above the target (``None``: never)."""
    for when, score in curve(results, target, clock):
        if score >= target.value:
            return when
    return None


def target_table(runs: Mapping[str, Sequence[Mapping[str, Any]]], target: Target) -> dict[str, Any]:
    """``{"target", "clock", "runspecs": {runspec: {per_seed, reached, mean, std}},
    "diff": {runspec: paired difference to the first, over seeds where both reached}}``."""
    everything = [r for seeds in runs.values() for r in seeds]
    if not any(curve(r, target, "wall") for r in everything):
        raise FedkitError(
            f"--target {target.text}: no run scored {target.path} in any round (is "
            f"{target.metric!r} a metric of this task, and {target.scope!r} a scope it has?)"
        )
    clock = clock_of(everything)
    per_spec: dict[str, Any] = {}
    for spec, seeds in runs.items():
        times = [time_to_target(r, target, clock) for r in seeds]
        reached = [t for t in times if t is not None]
        per_spec[spec] = {
            "per_seed": times,
            "reached": len(reached) / len(times),
            "mean": float(np.mean(reached)) if reached else None,
            "std": float(np.std(reached)) if reached else None,
        }
    diff: dict[str, Any] = {}
    specs = list(runs)
    base = per_spec[specs[0]]["per_seed"]
    for spec in specs[1:]:
        pairs = [(t, b) for t, b in zip(per_spec[spec]["per_seed"], base) if None not in (t, b)]
        if len(pairs) >= 2:
            mine, theirs = zip(*pairs)
            diff[spec] = paired_difference(mine, theirs, higher_is_better=False)
    return {"target": target.text, "clock": clock, "runspecs": per_spec, "diff": diff}


def target_rows(table: Mapping[str, Any], digits: int = 1) -> list[dict[str, str]]:
    """One row per runspec for people: seeds reaching the target, mean ± std time, and the
    paired difference to the first runspec with both 95% intervals."""
    specs = table["runspecs"]
    baseline = next(iter(specs))
    rows = []
    for spec, entry in specs.items():
        n = len(entry["per_seed"])
        reached = round(entry["reached"] * n)
        d = table["diff"].get(spec)
        row = {
            "runspec": spec,
            "reached": f"{reached}/{n}",
            "time to target s": "-"
            if entry["mean"] is None
            else f"{entry['mean']:.{digits}f} ± {entry['std']:.{digits}f}",
            "per seed s": ", ".join(
                "-" if t is None else f"{t:.{digits}f}" for t in entry["per_seed"]
            ),
        }
        if spec == baseline:
            row.update({f"vs {baseline} s": "(baseline)", "95% CI t": "", "95% CI bootstrap": ""})
        elif d is None:
            row.update(
                {
                    f"vs {baseline} s": "n/a (< 2 seeds both reached)",
                    "95% CI t": "",
                    "95% CI bootstrap": "",
                }
            )
        else:
            row.update(
                {
                    f"vs {baseline} s": f"{d['mean']:+.{digits}f} over {d['seeds']} seeds",
                    "95% CI t": _interval(d["ci_t"], digits),
                    "95% CI bootstrap": _interval(d["ci_bootstrap"], digits),
                }
            )
        rows.append(row)
    return rows


def target_note(table: Mapping[str, Any]) -> str:
    """What the time-to-target table's numbers are."""
    clock = (
        "simulated seconds (site profiles, docs/hospitals.md)"
        if table["clock"] == "simulated"
        else "wall seconds of the rounds (no run had simulated time)"
    )
    baseline = next(iter(table["runspecs"]))
    return (
        f"Time to {table['target']}: {clock} until the first round at or above it; reached: "
        f"seeds that got there; mean ± std over those seeds. vs {baseline}: paired "
        f"difference over the seeds where both reached it (negative: sooner), 95% intervals "
        "by paired t and bootstrap."
    )


def _interval(pair: Sequence[float], digits: int) -> str:
    return f"[{pair[0]:+.{digits}f}, {pair[1]:+.{digits}f}]"


def plot_time(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    target: Target,
    clock: str,
    path: Path,
    formats: Sequence[str] = ("png",),
) -> Path:
    """The target's score against time: one line per seed, a colour per runspec, the target
    as a dashed line and each run's time to it marked."""
    from fedkit_core.results.plots import _legend_below, _pyplot, save_figure

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (spec, seeds) in enumerate(runs.items()):
        color = f"C{i % 10}"
        for k, results in enumerate(seeds):
            points = curve(results, target, clock)
            if not points:
                continue
            t, y = zip(*points)
            ax.plot(t, y, "-", lw=1.2, alpha=0.85, color=color, label=spec if k == 0 else None)
            reached = time_to_target(results, target, clock)
            if reached is not None:
                ax.plot([reached], [y[t.index(reached)]], "o", ms=4, color=color)
    ax.axhline(target.value, ls="--", lw=1, color="0.3", label=f"target {target.value:g}")
    split = "test" if target.split == "final" else "validation"
    scope = "global model" if target.scope == "global" else "clients' mean"
    ax.set_ylabel(f"{split} {metric_name(target.metric)} ({scope})")
    times = [t for line in ax.get_lines() for t in line.get_xdata() if t > 0]
    if times and max(times) > 30 * min(times):  # minutes against hours: a log axis
        ax.set_xscale("log")
    ax.set_xlabel(f"{clock} time (s)")
    ax.grid(alpha=0.3)
    ax.set_title("score against time, one line per seed")
    _legend_below(fig, [ax])
    return save_figure(fig, path, formats)


def write_target(
    out: Path,
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    target: Target,
    table: Mapping[str, Any],
    formats: Sequence[str] = ("png",),
) -> None:
    """The time-to-target table after the others in ``out/compare.md``, and the figure
    ``out/compare-time`` (in ``formats``)."""
    from fedkit_core.fileio import write_text
    from fedkit_core.results.tables import rows_markdown

    md = out / "compare.md"
    before = md.read_text(encoding="utf-8") if md.is_file() else ""
    section = "\n\n".join([target_note(table), rows_markdown(target_rows(table))])
    write_text(md, (before.rstrip("\n") + "\n\n" if before else "") + section)
    plot_time(runs, target, table["clock"], out / "compare-time.png", formats)
