"""The privacy-utility summary of ``fedkit compare``: each method's utility against the
epsilon it spent, and the epsilon at which it stops beating FedAvg.

Runspecs are grouped by method (the runspec without its ``dp(...)`` term, see
:mod:`.runspec`); a method's run at a privacy setting is compared seed by seed with FedAvg's
run at the same setting (``fedavg+dp(<same>)``, or ``fedavg`` without DP) on the main
metric of the global model (the clients' mean where there is none). A method beats FedAvg
at a setting when the paired difference is positive and, with 3 or more seeds, significant
(both 95% intervals above 0; :mod:`fedkit_core.metrics.paired`); with fewer seeds the mean
difference alone decides and the summary says so. Written: ``compare.privacy.json``, a
section of ``compare.md`` and the ``compare.privacy`` figure (PNG, PDF, SVG).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.metrics.paired import paired_difference
from fedkit_core.privacy.runspec import method_and_dp
from fedkit_core.results.labels import metric_name

BASELINE = "fedavg"


def _utility(results: Mapping[str, Any], main: str) -> float:
    final = results["final"]
    scope = final.get("global") or final.get("clients_mean") or {}
    return float(scope.get(main, math.nan))


def _setting(dp: Mapping[str, Any] | None) -> str:
    """A privacy setting's key: its dp section as sorted JSON ('none' without DP)."""
    return "none" if dp is None else json.dumps(dict(dp), sort_keys=True)


def privacy_utility(runs: Mapping[str, Sequence[Mapping[str, Any]]], main: str) -> dict[str, Any]:
    """``{"rows": [...], "methods": {method: {...}}}``: per runspec its method, epsilon (mean
    over seeds; ``inf`` without DP) and utility; per method the paired comparison with FedAvg
    at each setting and the epsilon at which it stops beating FedAvg. Empty when no runspec
    uses DP."""
    parsed = {spec: method_and_dp(spec) for spec in runs}
    if all(dp is None for _, dp in parsed.values()):
        return {}
    rows = []
    by_setting: dict[tuple[str, str], str] = {}
    for spec, seeds in runs.items():
        method, dp = parsed[spec]
        eps = [r["final"].get("privacy", {}).get("epsilon", math.inf) for r in seeds]
        values = [_utility(r, main) for r in seeds]
        rows.append(
            {
                "runspec": spec,
                "method": method,
                "setting": _setting(dp),
                "epsilon": float(np.mean(eps)),
                "mean": float(np.mean(values)),
                "std": float(np.std(values)),
                "per_seed": values,
            }
        )
        by_setting[(method, _setting(dp))] = spec
    row_of = {r["runspec"]: r for r in rows}
    methods: dict[str, Any] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        if method == BASELINE:
            continue
        comparisons = []
        for row in (r for r in rows if r["method"] == method):
            base = by_setting.get((BASELINE, row["setting"]))
            if base is None:
                continue
            diff = paired_difference(row["per_seed"], row_of[base]["per_seed"])
            enough = diff["seeds"] >= 3
            beats = diff["mean"] > 0 and (diff["significant"] or not enough)
            comparisons.append(
                {
                    "epsilon": row["epsilon"],
                    "runspec": row["runspec"],
                    "against": base,
                    "mean_diff": diff["mean"],
                    "ci_t": diff["ci_t"],
                    "significant": diff["significant"],
                    "beats": beats,
                }
            )
        comparisons.sort(key=lambda c: -c["epsilon"])
        methods[method] = {"comparisons": comparisons, "stops_at": _stops_at(comparisons)}
    seeds = min(len(s) for s in runs.values())
    return {"metric": main, "seeds": seeds, "rows": rows, "methods": methods}


def _stops_at(comparisons: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Walking from the largest epsilon down: the first epsilon where the method no longer
    beats FedAvg (None: it beats it at every epsilon compared)."""
    if not comparisons:
        return {"epsilon": None, "text": "no FedAvg run at the same privacy setting"}
    for c in comparisons:
        if not c["beats"]:
            eps = c["epsilon"]
            if eps == math.inf:
                return {"epsilon": eps, "text": "does not beat FedAvg even without DP"}
            return {"epsilon": eps, "text": f"stops beating FedAvg at epsilon {eps:.3g}"}
    low = comparisons[-1]["epsilon"]
    return {
        "epsilon": None,
        "text": f"beats FedAvg down to epsilon {low:.3g} (the lowest compared)",
    }


def markdown(summary: Mapping[str, Any]) -> str:
    """The privacy-utility section of ``compare.md``."""
    main = metric_name(summary["metric"], short=True)
    lines = [
        "## Privacy-utility",
        "",
        f"Test {main} of the global model (mean ± std over {summary['seeds']} seeds) against "
        "the epsilon spent (mean over seeds; inf: no DP). A method beats FedAvg at a privacy "
        "setting when its paired difference to FedAvg at the same setting is positive"
        + (
            " and significant (both 95% intervals above 0)."
            if summary["seeds"] >= 3
            else " (fewer than 3 seeds: the mean difference alone; no significance claimed)."
        ),
        "",
        f"| runspec | method | epsilon | {main} |",
        "|---|---|---|---|",
    ]
    for r in summary["rows"]:
        eps = "inf" if r["epsilon"] == math.inf else f"{r['epsilon']:.3g}"
        lines.append(
            f"| {r['runspec']} | {r['method']} | {eps} | {r['mean']:.4f} ± {r['std']:.4f} |"
        )
    if summary["methods"]:
        lines += [
            "",
            "| method | epsilon | vs FedAvg (mean diff, 95% CI t) | beats |",
            "|---|---|---|---|",
        ]
        for method, entry in summary["methods"].items():
            for c in entry["comparisons"]:
                eps = "inf" if c["epsilon"] == math.inf else f"{c['epsilon']:.3g}"
                low, high = c["ci_t"]
                lines.append(
                    f"| {method} | {eps} | {c['mean_diff']:+.4f} [{low:+.4f}, {high:+.4f}] | "
                    f"{'yes' if c['beats'] else 'no'} |"
                )
        lines += [""] + [f"- {m}: {e['stops_at']['text']}" for m, e in summary["methods"].items()]
    return "\n".join(lines) + "\n"


def plot(summary: Mapping[str, Any], path: Path, formats: Sequence[str] = ("png",)) -> Path:
    """The privacy-utility curves: utility against epsilon (log scale) per method, mean ±
    std over seeds; a method's run without DP as a dashed line."""
    from fedkit_core.results.plots import _pyplot, save_figure

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, method in enumerate(dict.fromkeys(r["method"] for r in summary["rows"])):
        color = colors[k % len(colors)]
        rows = sorted(
            (r for r in summary["rows"] if r["method"] == method), key=lambda r: r["epsilon"]
        )
        private = [r for r in rows if math.isfinite(r["epsilon"])]
        if private:
            ax.errorbar(
                [r["epsilon"] for r in private],
                [r["mean"] for r in private],
                yerr=[r["std"] for r in private],
                marker="o",
                capsize=3,
                color=color,
                label=method,
            )
        for r in rows:
            if not math.isfinite(r["epsilon"]):
                ax.axhline(r["mean"], ls="--", lw=1, color=color, label=f"{method}, no DP")
    if any(math.isfinite(r["epsilon"]) for r in summary["rows"]):
        ax.set_xscale("log")
    name = metric_name(summary["metric"])
    ax.set(xlabel="epsilon (at the run's delta)", ylabel=f"test {name}", title="privacy-utility")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, path, formats)


def write_privacy_utility(
    out: Path,
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    main: str,
    formats: Sequence[str] = ("png",),
) -> str:
    """Write ``compare.privacy.json`` and the ``compare.privacy`` figure (in ``formats``)
    into ``out``; return the ``compare.md`` section (empty when no runspec uses DP)."""
    from fedkit_core.results.store import write_json

    summary = privacy_utility(runs, main)
    if not summary:
        return ""
    write_json(out / "compare.privacy.json", _finite(summary))
    plot(summary, out / "compare.privacy.png", formats)
    return markdown(summary)


def _finite(value: Any) -> Any:
    """JSON without infinities: ``inf`` epsilon (no DP) written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
