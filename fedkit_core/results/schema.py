"""results.json: the record of a run that other tools read.

Top level: ``status`` (running / complete), ``config`` (resolved), ``plugins`` (name ->
version), ``task`` (description and clients), ``device``, ``rounds`` (one record per round:
``round``, ``sampled``, ``train`` losses per client, and on evaluated rounds ``global``,
``clients``, ``clients_mean``, ``fairness``, ``summary`` on the test split plus the same
under ``val``), ``events`` (client failures) and ``final``.

``final`` holds the last round's ``global``, ``clients``, ``clients_mean``, ``fairness``
(``std`` and ``worst`` of the main metric across clients), ``summary``; ``best`` (the round
with the best pooled validation main metric, and its test scopes) and ``wall_seconds``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCOPES = ("global", "clients", "clients_mean", "fairness", "summary")


class Results(dict):
    """``results.json`` as a dict, with attribute shortcuts for the main parts."""

    @property
    def final(self) -> dict[str, Any]:
        return self["final"]

    @property
    def rounds(self) -> list[dict[str, Any]]:
        return self["rounds"]

    @property
    def main_metric(self) -> str:
        return self["task"]["main_metric"]

    @classmethod
    def load(cls, path: str | Path) -> Results:
        from fedkit_core.results.store import RunDir

        path = Path(path)
        return cls(RunDir(path.parent if path.suffix == ".json" else path).load_results())


def _evaluated(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("global")]


def build_results(
    *,
    status: str,
    config: Mapping[str, Any],
    plugins: Mapping[str, str],
    task: Mapping[str, Any],
    device: str,
    records: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    wall_seconds: float,
) -> Results:
    main = task["main_metric"]
    final: dict[str, Any] = {"round": None, "wall_seconds": round(wall_seconds, 3)}
    evaluated = _evaluated(records)
    if evaluated:
        last = evaluated[-1]
        final.update({"round": last["round"], **{k: last.get(k, {}) for k in SCOPES}})
        scored = [r for r in evaluated if main in r.get("val", {}).get("global", {})]
        if scored:
            best = max(scored, key=lambda r: (r["val"]["global"][main], -r["round"]))
            final["best"] = {
                "round": best["round"],
                "metric": main,
                "val": best["val"]["global"],
                **{k: best.get(k, {}) for k in SCOPES},
            }
    return Results(
        status=status,
        config=dict(config),
        plugins=dict(plugins),
        task=dict(task),
        device=device,
        rounds=list(records),
        events=list(events),
        final=final,
    )


def metrics_csv(records: Sequence[Mapping[str, Any]]) -> str:
    """One row per round, split and scope (global, clients_mean, client:<id>)."""
    rows: list[dict[str, Any]] = []
    for record in _evaluated(records):
        for split, scopes in (("test", record), ("val", record.get("val", {}))):
            fair = scopes.get("fairness", {})
            base = {"round": record["round"], "split": split}
            rows.append({**base, "scope": "global", **scopes.get("global", {})})
            rows.append(
                {
                    **base,
                    "scope": "clients_mean",
                    **scopes.get("clients_mean", {}),
                    **(
                        {"fairness_std": fair["std"], "fairness_worst": fair["worst"]}
                        if fair
                        else {}
                    ),
                    **scopes.get("summary", {}),
                }
            )
            for cid, metrics in scopes.get("clients", {}).items():
                rows.append({**base, "scope": f"client:{cid}", **metrics})
    columns = ["round", "split", "scope"]
    for row in rows:
        columns += [k for k in row if k not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
