"""The summary of a comparison: ``compare.json``'s sections, the tables and notes of
``compare.md`` and ``compare.tex``, and the figures (:mod:`fedkit_core.comparison` runs the
comparison; docs/architecture.md, "References", says what each section holds).

``compare.json`` is ``{runspec: {metric: {mean, std, per_seed}}}`` (std over seeds with
ddof 0); with two or more seeds every other runspec is also compared with the first (the
baseline) seed by seed (:mod:`fedkit_core.metrics.paired`: ``diff.<runspec>.<metric>``,
the mean paired difference, paired-t and bootstrap 95% intervals, wins/ties/losses), and
``compare.md`` has a second table marking each difference significant or not. References
(``pooled``, ``solo``) are named under ``references`` and marked in every table and figure;
``clients`` holds every client's score per runspec and each runspec's paired gain over a
reference runspec client by client (:mod:`fedkit_core.results.clients`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.config import AGGREGATION_MODES, load_yaml
from fedkit_core.errors import FedkitError
from fedkit_core.fileio import folder_name, write_text
from fedkit_core.metrics.paired import paired_difference
from fedkit_core.plugin_manager import BUILTINS, installed
from fedkit_core.privacy.runspec import method_and_dp
from fedkit_core.results.clients import (
    CLIENTS,
    gain_rows,
    score_rows,
)
from fedkit_core.results.convergence import convergence_note
from fedkit_core.results.labels import (
    METRICS,
    REFERENCES,
    client_view,
    metric_name,
    value_range,
)
from fedkit_core.results.privacy import write_privacy_utility
from fedkit_core.results.schema import Results
from fedkit_core.results.tables import _cell, latex_table, markdown_table, rows_markdown

#: the runspec of the pooled reference (centralised training, not a plugin)
POOLED = "pooled"


def runspec_layer(spec: str) -> dict[str, Any]:
    """The config layer a RUNSPEC stands for (``pooled``: the pooled reference). A part
    naming an aggregation mode (``fedavg+fedbuff``, ``fedprox+deadline``) sets
    ``aggregation``, the others are plugins; ``+dp(...)`` runs the method under DP."""
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        layer = load_yaml(spec)
        layer.setdefault("plugins", [])
        return layer
    if spec == POOLED:
        return {"plugins": [], "pooled": True}
    method, dp = method_and_dp(spec)  # `fca+dp(eps=4)`: a method under DP (privacy/runspec.py)
    parts = [p for p in method.split("+") if p and p != "fedavg"]
    modes = [p for p in parts if p in AGGREGATION_MODES]
    if len(modes) > 1:
        raise FedkitError(f"runspec {spec!r} names two aggregation modes: {modes}")
    layer: dict[str, Any] = {"plugins": [p for p in parts if p not in AGGREGATION_MODES]}
    if modes:
        layer["aggregation"] = modes[0]
    return {**layer, "dp": dp} if dp is not None else layer


def runspec_label(spec: str) -> str:
    """The folder of a runspec's runs in the comparison's folder (never outside it)."""
    return folder_name(Path(spec).stem if spec.endswith((".yaml", ".yml")) else spec)


def drop_foreign_sets(sets: Mapping[str, Any], active: Sequence[str]) -> dict[str, Any]:
    """Keys (dotted or nested) of a plugin the runspec does not use are ignored for it."""
    plugins = set(installed()) | set(BUILTINS)
    return {
        k: v for k, v in sets.items() if k.split(".")[0] not in plugins or k.split(".")[0] in active
    }


def runspec_layers(
    spec: str, base: Sequence[Mapping[str, Any]], sets: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The config layers of one runspec: the shared layers (``--config``, task flags), its
    own layer, then the ``--set`` pairs. Plugin keys of the shared layers and of ``--set``
    are dropped when the runspec does not use that plugin, so one config file can hold the
    common setting and every method's options (``fedkit compare fedavg fed-mas --config``)."""
    layer = runspec_layer(spec)
    active = layer.get("plugins") or []
    shared = [drop_foreign_sets(b, active) for b in base]
    return [*shared, layer, drop_foreign_sets(sets, active)]


def metric_paths(results: Mapping[str, Any]) -> dict[str, float]:
    """The comparable numbers of one run, by dotted path."""
    final = results["final"]
    out: dict[str, float] = {}
    for scope in ("global", "clients_mean", "summary"):
        for name, value in final.get(scope, {}).items():
            out[f"final.{scope}.{name}"] = value
    fair = final.get("fairness", {})
    if fair:
        out["final.fairness.std"] = fair["std"]
        out["final.fairness.worst"] = fair["worst"]
    for name, value in final.get("best", {}).get("global", {}).items():
        out[f"best.global.{name}"] = value
    out["final.wall_seconds"] = final["wall_seconds"]
    if "privacy" in final:  # a DP run: the epsilon it spent
        out["final.privacy.epsilon"] = final["privacy"]["epsilon"]
    if "simulated_seconds" in final:
        out["final.simulated_seconds"] = final["simulated_seconds"]
    return out


def aggregate(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{runspec: {metric path: {mean, std, per_seed}}}`` over each runspec's seeds."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for spec, seeds in runs.items():
        paths = [metric_paths(r) for r in seeds]
        keys = [k for k in paths[0] if all(k in p for p in paths)]
        table[spec] = {
            k: {
                "mean": float(np.mean([p[k] for p in paths])),
                "std": float(np.std([p[k] for p in paths])),
                "per_seed": [p[k] for p in paths],
            }
            for k in keys
        }
    return table


#: the list of the files a comparison wrote in its folder (removed by the next one)
MANIFEST = ".fedkit-compare.json"
#: the compare.json key of the paired differences
DIFF = "diff"
#: the compare.json key naming the runspecs that are references (``{runspec: kind}``)
REFERENCES_KEY = "references"
#: the compare.json key of each runspec's convergence (:mod:`fedkit_core.results.convergence`)
CONVERGENCE = "convergence"
#: the compare.json key of the time to a target (``--target``)
TIME_TO_TARGET = "time_to_target"
#: the compare.json key of the sentences saying what a comparison's runspecs do not share
#: (``allow_unpaired``)
WARNINGS = "warnings"
#: how a warning about the runs' environments begins (console, compare.json, compare.md)
ENVIRONMENTS_DIFFER = (
    "the runs' environments differ, so the paired differences also hold the kernels' last-bit drift"
)
#: compare.json keys that are not runspecs
RESERVED = (DIFF, CLIENTS, REFERENCES_KEY, CONVERGENCE, TIME_TO_TARGET, WARNINGS)
#: the compared numbers where lower is better (all others: higher is better)
LOWER_IS_BETTER = ("final.fairness.std", "final.wall_seconds", "final.simulated_seconds")


def paired_table(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{runspec: {metric path: paired difference}}`` of every runspec but the first (the
    baseline) against the first, seed by seed, on the metrics both have; empty with fewer
    than two seeds (see :func:`fedkit_core.metrics.paired.paired_difference`)."""
    specs = list(table)
    base = table[specs[0]]
    if len(next(iter(base.values()))["per_seed"]) < 2:
        return {}
    return {
        spec: {
            k: paired_difference(
                entry["per_seed"],
                base[k]["per_seed"],
                higher_is_better=k not in LOWER_IS_BETTER,
                bounds=value_range(k),
            )
            for k, entry in table[spec].items()
            if k in base
        }
        for spec in specs[1:]
    }


def _columns(table: Mapping[str, Mapping[str, Any]], main: str) -> list[str]:
    """The compared numbers: the standard ones any runspec has (a runspec without one, e.g.
    ``solo`` without a global model, shows ``-``: the other runspecs' global numbers stay in
    the table), then the plugin summaries every runspec has."""
    first = next(iter(table.values()))
    wanted = [
        f"final.global.{main}",
        f"final.clients_mean.{main}",
        "final.fairness.std",
        "final.fairness.worst",
        f"best.global.{main}",
    ]
    for metric in ("bauc", "tail_acc", "dice_bg"):
        wanted += [f"final.global.{metric}", f"final.clients_mean.{metric}"]
    shown = [c for c in dict.fromkeys(wanted) if any(c in row for row in table.values())]
    summaries = sorted(k for k in first if k.startswith("final.summary."))
    return shown + [c for c in summaries if all(c in row for row in table.values())]


def metric_label(path: str) -> str:
    """``final.clients_mean.bacc`` -> ``clients mean bACC`` (for people, not files)."""
    kind, scope, name = path.split(".", 2)
    if scope == "fairness":
        return f"fairness {name}"
    scope = {"summary": "", "clients_mean": "clients mean"}.get(scope, scope)
    label = f"{scope} {metric_name(name, short=True)}".strip()
    return f"{label}, best val round" if kind == "best" else label


def reference_labels(references: Mapping[str, str]) -> dict[str, str]:
    """How tables and figures name the reference runspecs (``{runspec: kind}``):
    ``pooled (reference: centralised)``, ``solo (reference: local)``."""
    what = {"pooled": "centralised"}
    return {spec: f"{spec} (reference: {what.get(k, k)})" for spec, k in references.items()}


def references_note(references: Mapping[str, str]) -> str:
    """What the compared references are (empty without any)."""
    if not references:
        return ""
    parts = "; ".join(f"{spec}: {REFERENCES[kind]}" for spec, kind in references.items())
    return f"References, not methods: {parts}."


@dataclass
class Comparison:
    """What ``compare`` found: the ``compare.json`` table, the main metric, the seeds, the
    paired differences against the first runspec (:func:`paired_table`), the runspecs that
    are references (``{runspec: kind}``) and the per-client section
    (:func:`~fedkit_core.results.clients.clients_section`)."""

    table: dict[str, dict[str, dict[str, Any]]]
    main: str
    seeds: list[int]
    diff: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    references: dict[str, str] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)
    #: ``{runspec: convergence}`` (:func:`fedkit_core.results.convergence.convergence`)
    convergence: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: each runspec's batch-norm policy (:func:`bn_policy`)
    bn: dict[str, str] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        """Runspec names for people: references marked (:func:`reference_labels`)."""
        return reference_labels(self.references)

    #: time to the ``--target`` (:func:`fedkit_core.results.timing.target_table`), if asked
    target: dict[str, Any] | None = None
    #: whether compare.json and the rest were written (not in a read-only folder)
    written: bool = True
    #: what the runspecs do not share, when compared anyway (``allow_unpaired``)
    warnings: list[str] = field(default_factory=list)
    #: how many of the runs were found finished in their folders and reused, not run
    reused: int = 0
    #: where the runs' recorded environments differ (:func:`environment_differences`)
    environments: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, str]]:
        """One row per compared number, one column per runspec (mean ± std), for a console;
        then the batch-norm policy of each."""
        names = self.labels
        rows = [
            {
                "metric": metric_label(c),
                **{names.get(s, s): _cell(r.get(c), 1.0, 4, " ± ") for s, r in self.table.items()},
            }
            for c in _columns(self.table, self.main)
        ]
        if self.bn:
            rows.append(
                {
                    "metric": "batch norm",
                    **{names.get(s, s): self.bn.get(s, "") for s in self.table},
                }
            )
        return rows

    def diff_rows(self) -> list[dict[str, str]]:
        """One row per runspec and compared number: the paired difference to the baseline."""
        return diff_rows(self.diff, _columns(self.table, self.main))

    def client_rows(self, highlight: Collection[str] = ()) -> list[dict[str, str]]:
        """One row per client: its score under each runspec (mean ± std over seeds)."""
        return score_rows(self.clients, self.labels, highlight) if self.clients else []

    def gain_rows(self, highlight: Collection[str] = ()) -> list[dict[str, str]]:
        """One row per client: each runspec's paired gain over the reference."""
        return gain_rows(self.clients, self.labels, highlight) if self.clients else []


def diff_rows(
    diff: Mapping[str, Mapping[str, Mapping[str, Any]]], columns: Sequence[str], digits: int = 4
) -> list[dict[str, str]]:
    """The paired differences as rows for people: runspec and metric, mean difference, both
    95% intervals, wins/ties/losses (W/T/L) and whether the difference is significant."""

    def interval(pair: Sequence[float]) -> str:
        return f"[{pair[0]:+.{digits}f}, {pair[1]:+.{digits}f}]"

    return [
        {
            "metric": f"{spec}: {metric_label(c)}"
            + (" (lower better)" if c in LOWER_IS_BETTER else ""),
            "mean diff": f"{d['mean']:+.{digits}f}",
            "95% CI t": interval(d["ci_t"]),
            "95% CI bootstrap": interval(d["ci_bootstrap"]),
            "W/T/L": f"{d['wins']}/{d['ties']}/{d['losses']}",
            "significant": "yes" if d["significant"] else "no",
        }
        for spec, row in diff.items()
        for c in columns
        if (d := row.get(c)) is not None
    ]


def environment_differences(runs: Mapping[str, Sequence[Results]]) -> list[str]:
    """One sentence per ``environment`` key (results.json: torch, numpy, Python, CPU kernels,
    threads) on which the compared runs differ, naming which runs had which value. The same
    seed repeats a run bit for bit only in one environment, so a paired difference between
    runs of two environments also holds the kernels' last-bit drift, which grows to the third
    digit within tens of rounds. Runs written before the environment was recorded are left
    out (nothing to compare)."""
    seen: dict[str, dict[str, list[str]]] = {}
    for spec, results in runs.items():
        for r in results:
            env = r.get("environment")
            if not env:
                continue
            where = f"{spec} seed {r['config'].get('seed')}"
            for key, value in env.items():
                seen.setdefault(key, {}).setdefault(str(value), []).append(where)
    sentences = []
    for key, values in sorted(seen.items()):
        if len(values) > 1:
            parts = [
                f"{value} ({', '.join(where[:3])}{', ...' if len(where) > 3 else ''})"
                for value, where in values.items()
            ]
            sentences.append(f"{key}: " + "; ".join(parts))
    return sentences


def bn_policy(results: Mapping[str, Any]) -> str:
    """A run's batch-norm policy (``normalisation.bn`` of results.json: average, local,
    mixed, none; ``unknown`` for results written before it was recorded)."""
    return results.get("normalisation", {}).get("bn", "unknown")


def bn_note(bn: Mapping[str, str]) -> str:
    """What the batch-norm policies of the compared runspecs mean for their numbers."""
    meaning = {
        "average": "averaged with the model (the global view uses the averaged statistics)",
        "local": "kept on each client (the global view evaluates each client with its own)",
        "mixed": "partly kept on the clients",
        "none": "none in the model",
        "unknown": "not recorded",
    }
    return (
        "Batch norm: "
        + "; ".join(f"{spec}: {meaning.get(policy, policy)}" for spec, policy in bn.items())
        + "."
    )


def notes(
    table: Mapping[str, Mapping[str, Any]],
    main: str,
    seeds: Sequence[int],
    views: Mapping[str, str],
    references: Mapping[str, str] | None = None,
    bn: Mapping[str, str] | None = None,
) -> list[str]:
    """What the table's numbers are: seeds, scopes, metric names, per runspec whether the
    per-client numbers come from personalised models (``views``: runspec -> the view that
    served the clients, see :func:`~fedkit_core.results.labels.client_view`) and which
    runspecs are references (``{runspec: kind}``, see :func:`references_note`)."""
    columns = _columns(table, main)
    used = dict.fromkeys(m for c in columns if (m := c.rsplit(".", 1)[-1]) in METRICS)
    names = "; ".join(f"{metric_name(m, short=True)}: {metric_name(m)}" for m in used)
    references = references or {}
    served = "; ".join(
        f"{spec}: {_served_by(v, references.get(spec))}" for spec, v in views.items()
    )
    about_references = references_note(references)
    return [
        f"Mean ± std over seeds {', '.join(map(str, seeds))}, final round, test split. "
        "global: the global model on the pooled test set; clients mean: unweighted mean over "
        f"the clients' test sets; fairness std / worst: std and worst of the clients' "
        f"{metric_name(main, short=True)}; best val round: the global model of the round best "
        f"on validation. {names}.",
        f"Per-client numbers: {served}.",
        *([about_references] if about_references else []),
        *([bn_note(bn)] if bn else []),
    ]


def _served_by(view: str, reference: str | None) -> str:
    """Which model scored a runspec's clients (its ``view``; a reference's own words)."""
    if reference == "pooled":
        return "the centrally trained model"
    if reference == "local":
        return "each client's own model"
    return "global model, not personalised" if view == "global" else f"personalised ({view} view)"


def diff_note(baseline: str, seeds: Sequence[int]) -> str:
    """What the paired-difference table's numbers are."""
    return (
        f"Paired differences to {baseline} (runspec minus {baseline}, seed by seed over "
        f"{len(seeds)} seeds): mean, 95% confidence intervals by paired t and by bootstrap "
        "(10000 resamples, fixed seed), and W/T/L: the seeds where the runspec is better / "
        "equal / worse. Significant: both intervals exclude 0; otherwise (no) the interval "
        "contains 0 and the difference is not told apart from seed noise."
    )


def write_summary(
    out: Path,
    table: Mapping[str, Mapping[str, Any]],
    runs: Mapping[str, Sequence[Results]],
    main: str,
    seeds: Sequence[int],
    diff: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    references: Mapping[str, str] | None = None,
    clients: Mapping[str, Any] | None = None,
    converged: Mapping[str, Mapping[str, Any]] | None = None,
    formats: Sequence[str] = ("png",),
    differences: Sequence[str] = (),
    environments: Sequence[str] = (),
) -> None:
    """``compare.md`` and ``compare.tex`` (the table and its notes, references marked;
    ``compare.md`` also the paired differences ``diff`` and the per-client tables of
    ``clients``), the ``compare`` figure (per-round curves, mean ± std over seeds,
    references dashed, the table's final test values marked) and the ``compare-clients``
    figure (each client's gain over the reference), in ``formats``."""
    from fedkit_core.results.plots import plot_client_gains, plot_groups

    references = references or {}
    labels = reference_labels(references)
    views = {spec: client_view(seeds_runs[0]["final"]) for spec, seeds_runs in runs.items()}
    bn = {spec: bn_policy(seeds_runs[0]) for spec, seeds_runs in runs.items()}
    columns = _columns(table, main)
    headers = [metric_label(c) for c in columns]
    paragraphs = notes(table, main, seeds, views, references, bn)
    parts = [*paragraphs, markdown_table(table, columns, headers=headers, labels=labels)]
    if environments:  # said before any number is read, like the unpaired keys below
        parts.insert(0, f"**Warning: {ENVIRONMENTS_DIFFER}.** " + "; ".join(environments) + ".")
    if differences:  # allowed with --allow-unpaired: said before any number is read
        parts.insert(0, "**Warning: not paired.** " + "; ".join(differences) + ".")
    if converged:
        parts.append(convergence_note(converged))
    if diff:
        parts += [diff_note(next(iter(table)), seeds), rows_markdown(diff_rows(diff, columns))]
    if clients and clients["scores"]:
        metric = metric_name(clients["metric"], short=True)
        parts += [
            f"Test {metric} of each client (mean ± std over seeds; the model that serves the "
            "client, as above):",
            rows_markdown(score_rows(clients, labels)),
        ]
        if clients["gains"]:
            parts += [
                f"Paired gain in {metric} over {labels.get(clients['reference'], clients['reference'])}"
                " per client. " + " ".join(clients["notes"]),
                rows_markdown(gain_rows(clients, labels)),
            ]
    privacy = write_privacy_utility(out, runs, main, formats)  # runspecs with dp(...)
    if privacy:
        parts.append(privacy)
    md = "\n\n".join(parts)
    write_text(out / "compare.md", md)
    tex = latex_table(table, columns, headers, caption=" ".join(paragraphs), labels=labels)
    write_text(out / "compare.tex", tex)
    plot_groups(runs, out / "compare.png", labels, formats)
    if clients and clients["gains"]:
        plot_client_gains(clients, out / "compare-clients.png", labels, formats)
