"""``fedkit compare``: several methods on the same task, partition and seeds, as papers do.

Each RUNSPEC (a plugin name, a combination ``a+b``, or a YAML config path) runs once per
seed into ``OUT/<label>/seed<k>/`` (an ordinary run directory, so an interrupted comparison
continues where it stopped; a folder holding a run of another config is refused, never reused
or overwritten). The summary is ``compare.json``
(``{runspec: {metric: {mean, std, per_seed}}}``, std over seeds with ddof 0),
``compare.md`` and ``compare.tex`` (the table to paste, with readable headers and notes) and
the ``compare`` figure (per-round curves with mean ± std bands; PNG, PDF, SVG). Keys of a
plugin that a runspec does not use are ignored for that runspec, in ``--set`` pairs and in
the shared ``--config`` file.

A runspec part naming an aggregation mode (``fedavg+fedbuff``) sets ``aggregation``; with
``target`` the time each run takes to reach a score is tabulated and drawn too
(:mod:`fedkit_core.results.timing`, docs/hospitals.md).

With two or more seeds every other runspec is also compared with the first (the baseline)
seed by seed (:mod:`fedkit_core.metrics.paired`): ``compare.json`` then holds
``diff.<runspec>.<metric>`` (mean paired difference, paired-t and bootstrap 95% intervals,
wins/ties/losses), and ``compare.md`` a second table marking each difference significant or
not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.config import AGGREGATION_MODES, load_yaml
from fedkit_core.errors import FedkitError
from fedkit_core.metrics.paired import paired_difference
from fedkit_core.plugins import BUILTINS, installed
from fedkit_core.results.labels import METRICS, client_view, metric_name
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir, write_json, write_text


def runspec_layer(spec: str) -> dict[str, Any]:
    """The config layer a RUNSPEC stands for. A part naming an aggregation mode
    (``fedavg+fedbuff``, ``fedprox+deadline``) sets ``aggregation``, the others are plugins."""
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        layer = load_yaml(spec)
        layer.setdefault("plugins", [])
        return layer
    parts = [p for p in spec.split("+") if p and p != "fedavg"]
    modes = [p for p in parts if p in AGGREGATION_MODES]
    if len(modes) > 1:
        raise FedkitError(f"runspec {spec!r} names two aggregation modes: {modes}")
    layer: dict[str, Any] = {"plugins": [p for p in parts if p not in AGGREGATION_MODES]}
    if modes:
        layer["aggregation"] = modes[0]
    return layer


def runspec_label(spec: str) -> str:
    return re.sub(
        r"[^A-Za-z0-9_.+-]+", "_", Path(spec).stem if spec.endswith((".yaml", ".yml")) else spec
    )


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


#: the compare.json key of the paired differences
DIFF = "diff"
#: the compared numbers where lower is better (all others: higher is better)
LOWER_IS_BETTER = ("final.fairness.std", "final.wall_seconds", "final.simulated_seconds")
#: the compare.json key of the time to a target (``--target``)
TIME_TO_TARGET = "time_to_target"


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
            )
            for k, entry in table[spec].items()
            if k in base
        }
        for spec in specs[1:]
    }


def _columns(table: Mapping[str, Mapping[str, Any]], main: str) -> list[str]:
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
    wanted += sorted(k for k in first if k.startswith("final.summary."))
    return [c for c in dict.fromkeys(wanted) if all(c in row for row in table.values())]


def metric_label(path: str) -> str:
    """``final.clients_mean.bacc`` -> ``clients mean bACC`` (for people, not files)."""
    kind, scope, name = path.split(".", 2)
    if scope == "fairness":
        return f"fairness {name}"
    scope = {"summary": "", "clients_mean": "clients mean"}.get(scope, scope)
    label = f"{scope} {metric_name(name, short=True)}".strip()
    return f"{label}, best val round" if kind == "best" else label


@dataclass
class Comparison:
    """What ``compare`` found: the ``compare.json`` table, the main metric, the seeds and
    the paired differences against the first runspec (:func:`paired_table`)."""

    table: dict[str, dict[str, dict[str, Any]]]
    main: str
    seeds: list[int]
    diff: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: time to the ``--target`` (:func:`fedkit_core.results.timing.target_table`), if asked
    target: dict[str, Any] | None = None

    def rows(self) -> list[dict[str, str]]:
        """One row per compared number, one column per runspec (mean ± std), for a console."""
        return [
            {
                "metric": metric_label(c),
                **{s: f"{r[c]['mean']:.4f} ± {r[c]['std']:.4f}" for s, r in self.table.items()},
            }
            for c in _columns(self.table, self.main)
        ]

    def diff_rows(self) -> list[dict[str, str]]:
        """One row per runspec and compared number: the paired difference to the baseline."""
        return diff_rows(self.diff, _columns(self.table, self.main))


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


def rows_markdown(rows: Sequence[Mapping[str, str]]) -> str:
    """Rows of equal keys as a markdown table."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_table(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    columns: Sequence[str],
    scale: float = 1.0,
    digits: int = 4,
    headers: Sequence[str] | None = None,
) -> str:
    """``{runspec: {column: {mean, std}}}`` as a markdown table of ``mean ± std`` cells
    (values times ``scale``: 100 for percent), headed by ``headers`` (default: the columns)."""
    head = headers or columns
    lines = ["| runspec | " + " | ".join(head) + " |", "|---" * (len(columns) + 1) + "|"]
    for spec, row in table.items():
        cells = [_cell(row[c], scale, digits, " ± ") for c in columns]
        lines.append(f"| {spec} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(entry: Mapping[str, Any], scale: float, digits: int, pm: str) -> str:
    return f"{scale * entry['mean']:.{digits}f}{pm}{scale * entry['std']:.{digits}f}"


_TEX = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\^{}",
    "\\": r"\textbackslash{}",
}


def _tex(text: str) -> str:
    return "".join(_TEX.get(c, c) for c in text).replace("±", r"$\pm$")


def latex_table(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    columns: Sequence[str],
    headers: Sequence[str],
    caption: str,
    digits: int = 4,
) -> str:
    """The :func:`markdown_table` as a booktabs ``table`` (``\\usepackage{booktabs}``)."""
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_tex(caption)}}}",
        r"\begin{tabular}{l" + "r" * len(columns) + "}",
        r"\toprule",
        "runspec & " + " & ".join(map(_tex, headers)) + r" \\",
        r"\midrule",
    ]
    for spec, row in table.items():
        cells = ["$" + _cell(row[c], 1.0, digits, r" \pm ") + "$" for c in columns]
        lines.append(f"{_tex(spec)} & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def notes(
    table: Mapping[str, Mapping[str, Any]],
    main: str,
    seeds: Sequence[int],
    views: Mapping[str, str],
) -> list[str]:
    """What the table's numbers are: seeds, scopes, metric names and, per runspec, whether
    the per-client numbers come from personalised models (``views``: runspec -> the view
    that served the clients, see :func:`~fedkit_core.results.labels.client_view`)."""
    columns = _columns(table, main)
    used = dict.fromkeys(m for c in columns if (m := c.rsplit(".", 1)[-1]) in METRICS)
    names = "; ".join(f"{metric_name(m, short=True)}: {metric_name(m)}" for m in used)
    served = "; ".join(
        f"{spec}: "
        + ("global model, not personalised" if v == "global" else f"personalised ({v} view)")
        for spec, v in views.items()
    )
    return [
        f"Mean ± std over seeds {', '.join(map(str, seeds))}, final round, test split. "
        "global: the global model on the pooled test set; clients mean: unweighted mean over "
        f"the clients' test sets; fairness std / worst: std and worst of the clients' "
        f"{metric_name(main, short=True)}; best val round: the global model of the round best "
        f"on validation. {names}.",
        f"Per-client numbers: {served}.",
    ]


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
) -> None:
    """``compare.md`` and ``compare.tex`` (the table and its notes; ``compare.md`` also the
    paired differences ``diff``) and the ``compare`` figure (per-round curves, mean ± std
    over seeds, as PNG, PDF and SVG)."""
    from fedkit_core.results.plots import plot_groups

    views = {spec: client_view(seeds_runs[0]["final"]) for spec, seeds_runs in runs.items()}
    columns = _columns(table, main)
    headers = [metric_label(c) for c in columns]
    paragraphs = notes(table, main, seeds, views)
    parts = [*paragraphs, markdown_table(table, columns, headers=headers)]
    if diff:
        parts += [diff_note(next(iter(table)), seeds), rows_markdown(diff_rows(diff, columns))]
    md = "\n\n".join(parts)
    write_text(out / "compare.md", md)
    tex = latex_table(table, columns, headers, caption=" ".join(paragraphs))
    write_text(out / "compare.tex", tex)
    plot_groups(runs, out / "compare.png")


def planned_runs(
    runspecs: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    base: Sequence[Mapping[str, Any]],
    sets: Mapping[str, Any],
) -> list[tuple[str, int, Path, list[Mapping[str, Any]]]]:
    """``(runspec, seed, run folder, config layers)`` of every run of a comparison."""
    return [
        (
            spec,
            seed,
            out / runspec_label(spec) / f"seed{seed}",
            [
                *runspec_layers(spec, base, sets),
                {"seed": seed},
            ],
        )
        for spec in runspecs
        for seed in seeds
    ]


def refuse_foreign_runs(plan: Sequence[tuple[str, int, Path, list[Mapping[str, Any]]]]) -> None:
    """Before any training: every planned folder that already holds a run must hold a run of
    the very same config (it is then reused); otherwise exit 2 naming each such folder and
    its differing keys. A comparison never reuses or overwrites a run of another config."""
    from fedkit_core.resolve import resolve_config

    problems = []
    for _, _, path, layers in plan:
        if RunDir(path).is_run():
            try:
                RunDir(path).require_config(resolve_config(layers)[0].nested())
            except FedkitError as err:
                problems.append(str(err))
    if problems:
        raise FedkitError("\n".join(problems))


def compare(
    runspecs: Sequence[str],
    *,
    seeds: Sequence[int],
    out: str | Path,
    base: Sequence[Mapping[str, Any]] = (),
    sets: Mapping[str, Any] | None = None,
    run_one: Callable[[list[Mapping[str, Any]], Path, str, int], Results] | None = None,
    jobs: int = 1,
    on_done: Callable[[str, int], None] | None = None,
    target: str | None = None,
) -> Comparison:
    """Run every runspec for every seed (reusing or continuing runs of the same config) and
    summarise exactly those runs.

    ``base``: config layers shared by all runs (a YAML file, task flags); ``sets``: ``--set``
    pairs, filtered per runspec; ``run_one(layers, out_dir, spec, seed)`` runs or continues one
    (default: :func:`fedkit_core.api.run` with ``reuse=True``, without progress display).
    With ``jobs`` > 1 the runs go to that many worker processes instead
    (:mod:`fedkit_core.results.parallel`; ``run_one`` is then unused and ``on_done(spec,
    seed)`` reports each finished run).
    Folders holding runs of another config are refused before anything runs, and the summary
    files of an earlier comparison in ``out`` are removed first, so they never outlive it.
    ``target`` (``final.global.bacc=0.80``): also the time each run took to reach it
    (:mod:`fedkit_core.results.timing`: a table in ``compare.md``, ``compare.json`` key
    ``time_to_target``, the figure ``compare-time``).
    """
    from fedkit_core import api
    from fedkit_core.results import timing

    goal = timing.parse_target(target) if target is not None else None

    out = Path(out)
    if run_one is None:

        def run_one(layers, path, spec, seed):
            return api.run(layers, out=path, reuse=True)

    for reserved in (DIFF, TIME_TO_TARGET):
        if reserved in runspecs:
            raise FedkitError(
                f"a runspec may not be named {reserved!r}: compare.json keeps that key"
            )
    if not isinstance(jobs, int) or jobs < 1:
        raise FedkitError(f"--jobs must be a whole number of at least 1, got {jobs!r}")
    plan = planned_runs(runspecs, seeds, out, base, sets or {})
    refuse_foreign_runs(plan)
    for stale in out.glob("compare.*"):
        stale.unlink()
    if jobs > 1:
        from fedkit_core.results.parallel import run_parallel

        done = run_parallel(plan, jobs, on_done)
    else:
        done = [run_one(layers, path, spec, seed) for spec, seed, path, layers in plan]
    runs: dict[str, list[Results]] = {}
    for (spec, *_), results in zip(plan, done, strict=True):
        runs.setdefault(spec, []).append(results)
    main = done[-1]["task"]["main_metric"]
    table = aggregate(runs)
    diff = paired_table(table)
    times = timing.target_table(runs, goal) if goal is not None else None
    summary: dict[str, Any] = {**table, DIFF: diff} if diff else dict(table)
    if times is not None:
        summary[TIME_TO_TARGET] = times
    write_json(out / "compare.json", summary)
    write_summary(out, table, runs, main, seeds, diff)
    if times is not None:
        timing.write_target(out, runs, goal, times)
    return Comparison(table, main, list(seeds), diff, times)
