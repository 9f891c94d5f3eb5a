"""results.json: the record of a run that other tools read.

Top level: ``status`` (running / complete), ``config`` (resolved), ``plugins`` (name ->
version), ``task`` (description and client ids), ``device``, ``rounds`` (one record per
round: ``round``, ``sampled``, ``train`` losses per client, ``bytes`` ({client id: {"down",
"up"}} as serialised; under client-level DP with secret client sampling only
``sampled_count``, ``trained_count`` and one ``bytes`` entry, ``"(all clients)"``, so that
nothing names the sampled clients), and on evaluated rounds ``evaluated`` (the splits scored: ``["val",
"test"]``, or ``["val"]`` in a round whose test split ``eval_test=improved`` skipped: its
``global`` and ``clients`` are then empty, as in a round not evaluated, and the other test
scopes absent), ``global``, ``clients``, ``clients_mean``, ``fairness``, ``summary``,
``views`` ({view: {"global", "clients"}}) on the test split plus the same under ``val``),
``privacy`` (a DP run's ``epsilon`` after the round, at ``delta``, and the mechanism's
per-round values), ``setup_bytes``, ``events`` (client failures; on Flower also a refused
second activation of a SuperNode key, ``phase`` ``activation``), ``nodes`` (Flower only:
who served each client, see :func:`fedkit_core.engines.flower.activations.node_record`),
``priors`` (each server prior sent to the
clients at setup: ``shape``, ``dtype`` and the ``sha256`` of its bytes, so frozen knowledge
such as FedCB's text statistics is identifiable) and ``final``. A reference run, not a
method, says so in ``reference`` (``kind``: ``pooled``, centralised training on the union of
the clients' data, or ``local``, each client alone; ``about``: what that means; see
:data:`~fedkit_core.results.labels.REFERENCES`); a method's results have no such key.
``normalisation`` says how batch-norm layers were handled (``bn`` = ``average``, ``local``,
``mixed`` or ``none``, their number, and what the ``global`` view evaluated with).
``environment`` names what the numbers depend on beyond the config, data and code: the
``torch``, ``numpy`` and ``python`` versions, torch's ``cpu_capability`` (the instruction set
its CPU kernels use) and ``threads`` (its intra-op threads in the process that wrote the
results: after a resume, the resuming one's; client processes follow ``local.threads`` or
``flower.client_cpus`` where set). The same seed gives the same numbers bit for bit only in the same environment.

``final`` holds the last round's (of a running run: the last round with test scores)
``global``, ``clients``, ``clients_mean``, ``fairness`` (``std`` and ``worst`` of the main
metric across clients), ``summary``, ``views``; ``best`` (the round with the best pooled
validation main metric, or the best clients' mean where no pooled global view exists, and
its test scopes), ``bytes`` (totals down and up, setup included), ``wall_seconds`` and, in a
DP run, ``privacy`` (the mechanism, its parameters, ``epsilon`` spent at ``delta``, what
evaluation reveals; see docs/privacy.md). ``warnings`` lists sentences about a result that
looks valid but is not (a global model predicting one class for every test image or at
chance, sites whose model does so there, or no foreground; :func:`run_warnings`); a
test-scored round record of a classification task holds ``predicted_classes``, the classes
its global model predicted on that split, and ``one_class_sites`` ({client id: class} of the
sites whose model predicted one class there).

Runs with a virtual clock (``sites``, or an ``aggregation`` other than ``sync``; see
docs/hospitals.md) also hold ``simulated_seconds`` in every round record (the simulated
time when the round's training and aggregation ended) and in ``final``; a round record
holds ``outages`` (``{"client", "from", "to", "waited"}``) when a site's work waited
for one, and asynchronous rounds hold ``updates`` (per applied update: ``client``,
``version`` trained on, ``staleness``, ``weight``, ``arrived``) and ``server_updates``.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedkit_core.results.labels import REFERENCES, reference_of

if TYPE_CHECKING:
    import torch

SCOPES = ("global", "clients", "clients_mean", "fairness", "summary", "views")
#: the ``phase`` of an event that is no client's failure but a warning to the operator: a
#: refused second activation of a SuperNode's key (a Flower deployment; docs/engines.md)
ACTIVATION = "activation"


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
    return [r for r in records if "val" in r]


def has_test(record: Mapping[str, Any]) -> bool:
    """Whether a round record holds test scores: an evaluated round (``val``) that is not
    marked as evaluated on validation only (``evaluated: ["val"]``, see ``eval_test``)."""
    return "val" in record and "test" in record.get("evaluated", ("val", "test"))


def best_round(
    evaluated: Sequence[Mapping[str, Any]], main: str
) -> tuple[Mapping[str, Any], str] | None:
    """The evaluated round record with the best validation main metric (the earliest of
    equals) and its scope: pooled (``global``), else the clients' mean. The server asks it
    after each round's validation to decide whether to score the test split
    (``eval_test=improved``): the round :func:`build_results` reports as ``best`` was the
    best so far when it was evaluated, so it has test scores."""
    for scope in ("global", "clients_mean"):
        scored = [r for r in evaluated if main in r["val"].get(scope, {})]
        if scored:
            return max(scored, key=lambda r: (r["val"][scope][main], -r["round"])), scope
    return None


def _best(evaluated: Sequence[Mapping[str, Any]], main: str) -> dict[str, Any] | None:
    """``final.best``: the :func:`best_round`, its validation scores and its test scopes."""
    found = best_round(evaluated, main)
    if found is None:
        return None
    best, scope = found
    return {
        "round": best["round"],
        "metric": main,
        "scope": scope,
        "val": best["val"][scope],
        **{k: best.get(k, {}) for k in SCOPES},
    }


def traffic_totals(
    records: Sequence[Mapping[str, Any]], setup: Mapping[str, Mapping[str, int]]
) -> dict[str, int]:
    """Bytes sent down and up over the whole run, setup included."""
    parts = [setup, *(r.get("bytes", {}) for r in records)]
    return {way: sum(c[way] for part in parts for c in part.values()) for way in ("down", "up")}


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
    setup_bytes: Mapping[str, Mapping[str, int]] | None = None,
    priors: Mapping[str, torch.Tensor] | None = None,
    privacy: Mapping[str, Any] | None = None,
    normalisation: Mapping[str, Any] | None = None,
    config_edits: Sequence[Mapping[str, Any]] = (),
    unverified: Sequence[Mapping[str, Any]] = (),
    nodes: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
) -> Results:
    """The results of a run: its config (with accepted edits, ``config_edits``: from which
    round on each edited config was used; resumes from checkpoint files without digests,
    ``unverified``), task, per-round records, events, who served each client (``nodes``,
    where the engine has nodes), what the numbers depend on beyond these (``environment``)
    and the final and best rounds' scores."""
    main = task["main_metric"]
    setup_bytes = dict(setup_bytes or {})
    final: dict[str, Any] = {
        "round": None,
        "wall_seconds": round(wall_seconds, 3),
        "bytes": traffic_totals(records, setup_bytes),
    }
    if records and "simulated_seconds" in records[-1]:  # a virtual clock's (sites, aggregation)
        final["simulated_seconds"] = records[-1]["simulated_seconds"]
    evaluated = _evaluated(records)
    scored = [r for r in evaluated if has_test(r)]
    if scored:  # the last round always has test scores; a running run's last may not
        last = scored[-1]
        final.update({"round": last["round"], **{k: last.get(k, {}) for k in SCOPES}})
    if evaluated:
        best = _best(evaluated, main)
        if best is not None:
            final["best"] = best
    reference = reference_of(config)
    marker = {"reference": {"kind": reference, "about": REFERENCES[reference]}} if reference else {}
    if privacy is not None:  # differential privacy: the mechanism and the epsilon spent
        final["privacy"] = dict(privacy)
    edits = {"config_edits": [dict(e) for e in config_edits]} if config_edits else {}
    if unverified:
        edits["unverified_resumes"] = [dict(u) for u in unverified]
    warned = run_warnings(scored[-1] if scored else {}, task)
    return Results(
        status=status,
        **marker,
        config=dict(config),
        **edits,
        plugins=dict(plugins),
        task=dict(task),
        device=device,
        **({"environment": dict(environment)} if environment is not None else {}),
        rounds=list(records),
        setup_bytes=setup_bytes,
        events=list(events),
        **({"nodes": dict(nodes)} if nodes is not None else {}),
        priors=prior_digests(priors or {}),
        normalisation=describe_normalisation(normalisation or {}),
        final=final,
        warnings=warned,
    )


#: why a model ends up predicting one class, said with the warning
ONE_CLASS_CAUSES = (
    "Usual causes: too few rounds or local steps for the data, a learning rate too high "
    "(the loss diverged) or too low, a strong class imbalance trained without a balanced "
    "loss (try --set loss=bsm), or labels that are not 0..K-1 per class."
)
#: in a differentially private run, the first cause to name
DP_CAUSE = (
    "In this differentially private run the noise added for privacy may drown the updates: "
    "try a larger privacy budget (epsilon), more clients or data per round, or more rounds. "
)
#: how far above chance a balanced accuracy still counts as chance
CHANCE_MARGIN = 0.01


def run_warnings(last: Mapping[str, Any], task: Mapping[str, Any]) -> list[str]:
    """Sentences about a result that looks valid but is not (``results.json``'s
    ``warnings``): a classifier whose global model predicts one class for every test image
    or scores a bACC at chance (or below), sites whose model does either there (named), a
    segmentation model that finds no foreground. In a DP run (the record holds ``privacy``)
    the noise is named among the causes."""
    names = list(task.get("class_names") or [])
    causes = (DP_CAUSE if "privacy" in last else "") + ONE_CLASS_CAUSES
    dice = last.get("global", {}).get("dice")
    if dice is not None and dice < 1e-3:
        return [
            f"the global model finds no foreground (test Dice {dice:.4f}): it predicts "
            "background everywhere. Usual causes: too few rounds, a learning rate too high or "
            "too low, or masks whose foreground is not 1..K-1."
        ]
    if len(names) < 2:
        return []
    chance = 1.0 / len(names)
    warned = []
    predicted = last.get("predicted_classes")
    bacc = (last.get("global") or {}).get("bacc")
    if predicted is not None and len(predicted) == 1:
        c = predicted[0]
        warned.append(
            f"the global model predicts a single class, {_class(names, c)}, for every test "
            f"image at every site: its accuracy is that class's share and its bACC is chance. "
            + causes
        )
    elif bacc is not None and bacc <= chance + CHANCE_MARGIN:
        warned.append(
            f"the global model is at chance: test bACC {bacc:.4f}, chance {chance:.4f} "
            f"({len(names)} classes). " + causes
        )
    sites = {} if warned and len(predicted or ()) == 1 else _sites_at_chance(last, names, chance)
    if sites:  # (a global model of one class predicts it at every site: said above)
        listing = "; ".join(f"{cid}: {why}" for cid, why in sites.items())
        warned.append(
            f"{len(sites)} of {len(last.get('clients') or sites)} sites' models mean nothing "
            f"there ({listing}): their numbers are chance, whatever the mean says. " + causes
        )
    return warned


def _class(names: Sequence[str], c: int) -> str:
    return f"{names[c]!r} (class {c})" if c < len(names) else f"class {c}"


def _sites_at_chance(
    last: Mapping[str, Any], names: Sequence[str], chance: float
) -> dict[str, str]:
    """``{site: why}`` of the sites whose model predicted one class at that site or scored
    its test bACC at chance."""
    one_class = last.get("one_class_sites") or {}
    out = {}
    for cid, metrics in (last.get("clients") or {}).items():
        bacc = metrics.get("bacc")
        if cid in one_class:
            out[cid] = f"predicts only {_class(names, one_class[cid])}"
        elif bacc is not None and bacc <= chance + CHANCE_MARGIN:
            out[cid] = f"bACC {bacc:.4f} at chance"
    return out


#: what the ``global`` view evaluates, per batch-norm policy (``normalisation.bn``)
GLOBAL_VIEWS = {
    "average": "the global model, batch-norm statistics averaged with the weights",
    "local": "the global weights with each client's own batch-norm layers (weights and "
    "statistics): no single global model exists",
    "mixed": "the global weights with each client's own copy of the batch-norm layers "
    "kept local, the others averaged",
    "none": "the global model (it has no batch-norm layers)",
}


def describe_normalisation(normalisation: Mapping[str, Any]) -> dict[str, Any]:
    """``normalisation`` of results.json: the ``bn`` policy of the model proper (``average``,
    ``local``, ``mixed``, ``none``), its number of batch-norm layers and what the ``global``
    view evaluated with (empty when unknown)."""
    if "bn" not in normalisation:
        return {}
    return {**normalisation, "global_view": GLOBAL_VIEWS[normalisation["bn"]]}


def prior_digests(priors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """``{name: {shape, dtype, sha256}}`` of server priors: what identifies them in a record."""
    import torch

    out = {}
    for name, tensor in sorted(priors.items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        out[name] = {
            "shape": list(tensor.shape),
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "sha256": hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest(),
        }
    return out


class PerRound:
    """``compute(record)`` of each round's record, kept while the record is unchanged, so
    that what is rewritten after every round costs the new round, not the whole history.

    A kept value is reused while its record is the same object holding the same top-level
    values (compared by identity): a record changed by setting a top-level key (as the
    server does when it scores the test split of an earlier round) is computed again. The
    rule it relies on: a record's nested values are never changed in place after its round
    (replace them by setting the top-level key instead).
    """

    def __init__(self, compute: Callable[[Mapping[str, Any]], Any]):
        self.compute = compute
        #: per round: the record, its top-level keys and values, and the computed value
        self._kept: list[tuple[Mapping[str, Any], tuple[Any, ...], tuple[Any, ...], Any]] = []

    def __call__(self, records: Sequence[Mapping[str, Any]]) -> list[Any]:
        """``compute`` of every record, in order."""
        del self._kept[len(records) :]
        for n, record in enumerate(records):
            keys, values = tuple(record), tuple(record.values())
            if n < len(self._kept):
                kept, kept_keys, kept_values, _ = self._kept[n]
                if (
                    kept is record
                    and kept_keys == keys
                    and all(a is b for a, b in zip(kept_values, values, strict=True))
                ):
                    continue
            self._kept[n : n + 1] = [(record, keys, values, self.compute(record))]
        return [kept[3] for kept in self._kept]


def metrics_csv(records: Sequence[Mapping[str, Any]]) -> str:
    """One row per round, split and scope (global, clients_mean, client:<id>)."""
    return MetricsCsv().text(records)


class MetricsCsv:
    """:func:`metrics_csv` rewritten after every round at the cost of the new round: each
    round's rows are built and formatted once (formatted again only when a later round
    brings a new column, which changes every row's cells)."""

    def __init__(self) -> None:
        self._rounds = PerRound(_csv_round)
        self._columns: list[str] = []

    def text(self, records: Sequence[Mapping[str, Any]]) -> str:
        """The CSV text of ``records``: a header, then every round's rows in order."""
        rounds = self._rounds(records)
        columns = ["round", "split", "scope"]
        for kept in rounds:
            columns += [k for k in kept["columns"] if k not in columns]
        if columns != self._columns:
            self._columns = columns
            for kept in rounds:
                kept["text"] = None
        header = io.StringIO()
        csv.DictWriter(header, fieldnames=columns).writeheader()
        for record, kept in zip(records, rounds, strict=True):
            if kept["text"] is None:  # the rows built with the columns, or again if dropped
                kept["text"] = _csv_text(kept.pop("rows", None) or _csv_rows(record), columns)
        return header.getvalue() + "".join(kept["text"] for kept in rounds)


def _csv_round(record: Mapping[str, Any]) -> dict[str, Any]:
    """One round's columns in order of appearance, its rows (dropped once formatted) and
    their text (formatted with the file's columns, see :meth:`MetricsCsv.text`)."""
    rows = _csv_rows(record)
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return {"columns": list(columns), "rows": rows, "text": None}


def _csv_text(rows: list[dict[str, Any]], columns: list[str]) -> str:
    out = io.StringIO()
    csv.DictWriter(out, fieldnames=columns, restval="").writerows(rows)
    return out.getvalue()


#: metrics.csv's own columns beside the metrics: no plugin metric may take their names
CSV_COLUMNS = ("round", "split", "scope", "epsilon", "fairness_std", "fairness_worst")


def _csv_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The metrics.csv rows of one round's record (none for a round not evaluated)."""
    if "val" not in record:
        return []
    rows: list[dict[str, Any]] = []
    splits = (("test", record),) if has_test(record) else ()
    for split, scopes in (*splits, ("val", record.get("val", {}))):
        fair = scopes.get("fairness", {})
        base = {"round": record["round"], "split": split}
        if "privacy" in record:  # differential privacy: epsilon spent after the round
            base["epsilon"] = record["privacy"]["epsilon"]
        rows.append({**base, "scope": "global", **scopes.get("global", {})})
        rows.append(
            {
                **base,
                "scope": "clients_mean",
                **scopes.get("clients_mean", {}),
                **({"fairness_std": fair["std"], "fairness_worst": fair["worst"]} if fair else {}),
                **scopes.get("summary", {}),
            }
        )
        for cid, metrics in scopes.get("clients", {}).items():
            rows.append({**base, "scope": f"client:{cid}", **metrics})
    return rows
