"""``fedkit compare``: several methods on the same task, partition and seeds, as papers do.

Each RUNSPEC (a plugin name, a combination ``a+b``, or a YAML config path) runs once per
seed into ``OUT/<label>/seed<k>/`` (an ordinary run directory, so an interrupted comparison
continues where it stopped; a folder holding a run of another config is refused, never reused
or overwritten). The summary is ``compare.json``
(``{runspec: {metric: {mean, std, per_seed}}}``, std over seeds with ddof 0),
``compare.md`` (a table to paste) and ``compare.png``. Keys of a plugin that a runspec does
not use are ignored for that runspec, in ``--set`` pairs and in the shared ``--config`` file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.config import load_yaml
from fedkit_core.errors import FedkitError
from fedkit_core.plugins import BUILTINS, installed
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir, write_json, write_text


def runspec_layer(spec: str) -> dict[str, Any]:
    """The config layer a RUNSPEC stands for."""
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        layer = load_yaml(spec)
        layer.setdefault("plugins", [])
        return layer
    return {"plugins": [p for p in spec.split("+") if p and p != "fedavg"]}


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
    """``final.clients_mean.bacc`` -> ``clients mean bacc`` (for people, not files)."""
    kind, scope, name = path.split(".", 2)
    scope = {"summary": "", "clients_mean": "clients mean", "fairness": "fairness"}.get(
        scope, scope
    )
    label = f"{scope} {name}".strip()
    return f"{label}, best val round" if kind == "best" else label


@dataclass
class Comparison:
    """What ``compare`` found: the ``compare.json`` table, the main metric and the seeds."""

    table: dict[str, dict[str, dict[str, Any]]]
    main: str
    seeds: list[int]

    def rows(self) -> list[dict[str, str]]:
        """One row per compared number, one column per runspec (mean ± std), for a console."""
        return [
            {
                "metric": metric_label(c),
                **{s: f"{r[c]['mean']:.4f} ± {r[c]['std']:.4f}" for s, r in self.table.items()},
            }
            for c in _columns(self.table, self.main)
        ]


def markdown_table(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    columns: Sequence[str],
    scale: float = 1.0,
    digits: int = 4,
) -> str:
    """``{runspec: {column: {mean, std}}}`` as a markdown table of ``mean ± std`` cells
    (values times ``scale``: 100 for percent)."""
    lines = ["| runspec | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for spec, row in table.items():
        cells = [
            f"{scale * row[c]['mean']:.{digits}f} ± {scale * row[c]['std']:.{digits}f}"
            for c in columns
        ]
        lines.append(f"| {spec} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(table: Mapping[str, Mapping[str, Any]], main: str, seeds: Sequence[int]) -> str:
    head = f"Mean ± std over seeds {', '.join(map(str, seeds))}.\n\n"
    return head + markdown_table(table, _columns(table, main))


def plot(table: Mapping[str, Mapping[str, Any]], main: str, path: Path) -> Path:
    from fedkit_core.results.plots import _pyplot, save_figure

    plt = _pyplot()
    cols = [c for c in _columns(table, main) if c != "final.fairness.std"][:6]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cols) + 2), 4))
    width = 0.8 / max(1, len(table))
    for i, (spec, row) in enumerate(table.items()):
        xs = np.arange(len(cols)) + i * width
        ax.bar(
            xs,
            [row[c]["mean"] for c in cols],
            width,
            yerr=[row[c]["std"] for c in cols],
            capsize=3,
            label=spec,
        )
    ax.set_xticks(
        np.arange(len(cols)) + width * (len(table) - 1) / 2,
        [c.replace("final.", "") for c in cols],
        rotation=20,
        ha="right",
        fontsize=8,
    )
    ax.set(ylim=(0, 1), title="mean ± std over seeds")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


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
) -> Comparison:
    """Run every runspec for every seed (reusing or continuing runs of the same config) and
    summarise exactly those runs.

    ``base``: config layers shared by all runs (a YAML file, task flags); ``sets``: ``--set``
    pairs, filtered per runspec; ``run_one(layers, out_dir, spec, seed)`` runs or continues one
    (default: :func:`fedkit_core.api.run` with ``reuse=True``, without progress display).
    Folders holding runs of another config are refused before anything runs, and the summary
    files of an earlier comparison in ``out`` are removed first, so they never outlive it.
    """
    from fedkit_core import api

    out = Path(out)
    if run_one is None:

        def run_one(layers, path, spec, seed):
            return api.run(layers, out=path, reuse=True)

    plan = planned_runs(runspecs, seeds, out, base, sets or {})
    refuse_foreign_runs(plan)
    for stale in out.glob("compare.*"):
        stale.unlink()
    runs: dict[str, list[Results]] = {}
    main = None
    for spec, seed, path, layers in plan:
        results = run_one(layers, path, spec, seed)
        runs.setdefault(spec, []).append(results)
        main = results["task"]["main_metric"]
    table = aggregate(runs)
    write_json(out / "compare.json", table)
    write_text(out / "compare.md", markdown(table, main, seeds))
    plot(table, main, out / "compare.png")
    return Comparison(table, main, list(seeds))
