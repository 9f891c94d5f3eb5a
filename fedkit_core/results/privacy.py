"""The privacy-utility summary of ``fedkit compare``: each method's utility against the
epsilon it spent, and the epsilon at which it stops beating FedAvg and, with ``solo`` among
the runspecs, training alone.

Runspecs are grouped by method (the runspec without its ``dp(...)`` term, see
:mod:`fedkit_core.privacy.runspec`); a method's run at a privacy setting is compared seed by seed with FedAvg's
run at the same setting (``fedavg+dp(<same>)``, or ``fedavg`` without DP) on the main
metric of the global model (the clients' mean where there is none). A method beats FedAvg
at a setting when the paired difference is positive and, with 3 or more seeds, significant
(both 95% intervals above 0; :mod:`fedkit_core.metrics.paired`); with fewer seeds the mean
difference alone decides and the summary says so.

With the local reference ``solo`` (each hospital trains alone on its own data: nothing
leaves it, so it needs no DP) every method, FedAvg included, is also compared with it at
every setting: the epsilon at which federating stops paying. Utility is then the clients'
mean for every runspec (each client's model on its own test split), the one scope ``solo``
has, so that the curves and the reference are on the same footing. Written: ``compare.privacy.json``, a
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
#: the local reference: each client alone (no DP: nothing leaves the client)
ALONE = "solo"


def _utility(results: Mapping[str, Any], main: str, scope: str = "global") -> float:
    """The run's final ``main`` metric in ``scope`` (the clients' mean where it has none)."""
    final = results["final"]
    values = final.get(scope) or final.get("clients_mean") or {}
    return float(values.get(main, math.nan))


def _setting(dp: Mapping[str, Any] | None) -> str:
    """A privacy setting's key: its dp section as sorted JSON ('none' without DP)."""
    return "none" if dp is None else json.dumps(dict(dp), sort_keys=True)


def privacy_utility(runs: Mapping[str, Sequence[Mapping[str, Any]]], main: str) -> dict[str, Any]:
    """``{"rows": [...], "methods": {method: {...}}}``: per runspec its method, epsilon (mean
    over seeds; ``inf`` without DP) and utility; per method the paired comparison with FedAvg
    at each setting and the epsilon at which it stops beating FedAvg, and with ``solo`` the
    same against training alone (``alone``). Empty when no runspec uses DP."""
    parsed = {spec: method_and_dp(spec) for spec in runs}
    if all(dp is None for _, dp in parsed.values()):
        return {}
    scope = "clients_mean" if ALONE in runs else "global"
    rows = []
    by_setting: dict[tuple[str, str], str] = {}
    for spec, seeds in runs.items():
        method, dp = parsed[spec]
        eps = [r["final"].get("privacy", {}).get("epsilon", math.inf) for r in seeds]
        values = [_utility(r, main, scope) for r in seeds]
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
        if method == ALONE:
            continue
        own = [r for r in rows if r["method"] == method]
        entry: dict[str, Any] = {}
        if method != BASELINE:
            against = [(r, by_setting.get((BASELINE, r["setting"]))) for r in own]
            comparisons = _compare([(r, row_of[b]) for r, b in against if b is not None])
            entry = {"comparisons": comparisons, "stops_at": _stops_at(comparisons, "FedAvg")}
        if ALONE in row_of:
            alone = _compare([(r, row_of[ALONE]) for r in own])
            entry["alone"] = {"comparisons": alone, "stops_at": _stops_at(alone, "training alone")}
        if entry:
            methods[method] = entry
    seeds = min(len(s) for s in runs.values())
    return {"metric": main, "scope": scope, "seeds": seeds, "rows": rows, "methods": methods}


def _compare(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Each (row, reference row) pair's paired difference, seed by seed, from the largest
    epsilon down. A row beats its reference when the difference is positive and, with 3 or
    more seeds, significant."""
    comparisons = []
    for row, base in pairs:
        diff = paired_difference(row["per_seed"], base["per_seed"])
        enough = diff["seeds"] >= 3
        comparisons.append(
            {
                "epsilon": row["epsilon"],
                "runspec": row["runspec"],
                "against": base["runspec"],
                "mean_diff": diff["mean"],
                "ci_t": diff["ci_t"],
                "significant": diff["significant"],
                "beats": diff["mean"] > 0 and (diff["significant"] or not enough),
            }
        )
    return sorted(comparisons, key=lambda c: -c["epsilon"])


def _stops_at(comparisons: Sequence[Mapping[str, Any]], reference: str) -> dict[str, Any]:
    """Walking from the largest epsilon down: the first epsilon where the method no longer
    beats ``reference`` (None: it beats it at every epsilon compared)."""
    if not comparisons:
        return {"epsilon": None, "text": f"no {reference} run at the same privacy setting"}
    for c in comparisons:
        if not c["beats"]:
            eps = c["epsilon"]
            if eps == math.inf:
                return {"epsilon": eps, "text": f"does not beat {reference} even without DP"}
            return {"epsilon": eps, "text": f"stops beating {reference} at epsilon {eps:.3g}"}
    low = comparisons[-1]["epsilon"]
    return {
        "epsilon": None,
        "text": f"beats {reference} down to epsilon {low:.3g} (the lowest compared)",
    }


def markdown(summary: Mapping[str, Any]) -> str:
    """The privacy-utility section of ``compare.md``."""
    main = metric_name(summary["metric"], short=True)
    where = (
        "the clients' mean (each client's model on its own test split, the scope of `solo`)"
        if summary.get("scope") == "clients_mean"
        else "the global model"
    )
    lines = [
        "## Privacy-utility",
        "",
        f"Test {main} of {where} (mean ± std over {summary['seeds']} seeds) against the epsilon "
        "spent (mean over seeds; inf: no DP). A method beats a reference at a privacy setting "
        "when its paired difference to it is positive"
        + (
            " and significant (both 95% intervals above 0)."
            if summary["seeds"] >= 3
            else " (fewer than 3 seeds: the mean difference alone; no significance claimed)."
        )
        + " The reference is FedAvg at the same setting"
        + (
            ", and training alone (`solo`, no DP: nothing leaves a client)."
            if _alone(summary)
            else "."
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
    verdicts = []
    for key, reference in (("comparisons", "FedAvg"), ("alone", "training alone")):
        table = [
            (method, entry[key] if key == "alone" else entry)
            for method, entry in summary["methods"].items()
            if key in entry
        ]
        if not table:
            continue
        lines += [
            "",
            f"| method | epsilon | vs {reference} (mean diff, 95% CI t) | beats |",
            "|---|---|---|---|",
        ]
        for method, found in table:
            for c in found["comparisons"]:
                eps = "inf" if c["epsilon"] == math.inf else f"{c['epsilon']:.3g}"
                low, high = c["ci_t"]
                lines.append(
                    f"| {method} | {eps} | {c['mean_diff']:+.4f} [{low:+.4f}, {high:+.4f}] | "
                    f"{'yes' if c['beats'] else 'no'} |"
                )
            verdicts.append(f"- {method}: {found['stops_at']['text']}")
    lines += [""] + verdicts if verdicts else []
    return "\n".join(lines) + "\n"


def _alone(summary: Mapping[str, Any]) -> bool:
    return any("alone" in entry for entry in summary["methods"].values())


def plot(summary: Mapping[str, Any], path: Path, formats: Sequence[str] = ("png",)) -> Path:
    """The privacy-utility curves: utility against epsilon (log scale) per method, mean ±
    std over seeds; a method's run without DP as a dashed line, ``solo`` as a dotted one."""
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
            if r["method"] == ALONE:
                ax.axhline(r["mean"], ls=":", lw=1.5, color="black", label="solo (each alone)")
            elif not math.isfinite(r["epsilon"]):
                ax.axhline(r["mean"], ls="--", lw=1, color=color, label=f"{method}, no DP")
    spent = sorted({round(r["epsilon"], 3) for r in summary["rows"] if math.isfinite(r["epsilon"])})
    if spent:  # a log axis ticked at the epsilons compared, in plain numbers
        ax.set_xscale("log")
        ax.set_xticks(spent, [f"{e:g}" for e in spent])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    name = metric_name(summary["metric"])
    if summary.get("scope") == "clients_mean":
        name = f"{name}, clients' mean"
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
