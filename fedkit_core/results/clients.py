"""Per-client numbers of a comparison: every client's score under each runspec, and each
runspec's paired gain over a reference runspec, client by client.

With the local reference (``solo``: each client trains alone) as the reference, the gain
answers "what does joining the federation buy this hospital?"; with FedAvg, "what does the
method add for this client over plain federated averaging?". The gain of runspec m for
client k is ``m_s[k] - reference_s[k]`` seed by seed, with the mean, 95% intervals and
wins/ties/losses of :func:`fedkit_core.metrics.paired.paired_difference` (significant only
with >= 3 seeds, both intervals excluding 0). With one seed there is one difference per
client and no interval (:func:`clients_section` notes it).

Seeds pair as in :mod:`fedkit_core.metrics.paired`; clients pair by id. With a fixed
partition (``sites``, ``fractions``) client ``c2`` is the same hospital, or the same share of
the data, in every seed; with a random split (``dirichlet``) it is a new draw each seed, and
its gain is that of "the k-th client of a random split". A client that a run did not score
(a failure tolerated by ``min_clients``) has no gain in the runspecs of that run; the
section lists it under ``missing``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from fedkit_core.errors import FedkitError
from fedkit_core.metrics.paired import paired_difference
from fedkit_core.results.labels import value_range

#: the compare.json key of the per-client section
CLIENTS = "clients"


def client_values(runs: Sequence[Mapping[str, Any]], metric: str) -> dict[str, list[float | None]]:
    """``{client id: [final test metric of each run]}`` of one runspec's runs (its seeds,
    in order): the clients each run's task names, ``None`` where a run did not score one."""
    ids = dict.fromkeys(cid for r in runs for cid in r["task"]["client_ids"])
    return {
        cid: [r["final"].get("clients", {}).get(cid, {}).get(metric) for r in runs] for cid in ids
    }


def client_gain(
    values: Sequence[float], reference: Sequence[float], metric: str = ""
) -> dict[str, Any]:
    """The paired gain of ``values`` over ``reference`` (one per seed, same order) in
    ``metric`` (its interval clipped to the metric's range): the full
    :func:`~fedkit_core.metrics.paired.paired_difference` from two seeds on; with one seed
    only its ``mean``, ``per_seed`` and ``seeds`` (no interval can be had)."""
    if len(values) != len(reference) or not values:
        raise FedkitError(
            f"per-client gains need one value per seed on both sides, got {len(values)} and "
            f"{len(reference)}"
        )
    if len(values) >= 2:
        return paired_difference(values, reference, bounds=value_range(metric))
    d = float(values[0]) - float(reference[0])
    return {"mean": d, "per_seed": [d], "seeds": 1}


def default_reference(runspecs: Sequence[str], kinds: Mapping[str, str | None]) -> str:
    """The reference of the per-client gains when none is chosen: the local reference (each
    client alone, ``kinds[spec] == "local"``) when one is compared, else the first runspec."""
    return next((s for s in runspecs if kinds.get(s) == "local"), runspecs[0])


def clients_section(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    metric: str,
    reference: str,
    seeds: Sequence[int],
) -> dict[str, Any]:
    """The per-client part of ``compare.json``: ``metric``, ``reference``, ``seeds``,
    ``scores`` (``{runspec: {client: {mean, std, per_seed}}}``, over the seeds that scored
    the client), ``gains`` (``{runspec: {client: gain}}`` of every runspec but the reference,
    see :func:`client_gain`), ``missing`` (``{runspec: {client: [seeds]}}``: the runs that
    did not score a client, which then has no gain there) and ``notes``.

    ``runs``: ``{runspec: [results of each seed, in the order of seeds]}``."""
    if reference not in runs:
        raise FedkitError(
            f"the reference {reference!r} is not one of the compared runspecs: " + ", ".join(runs)
        )
    values = {spec: client_values(r, metric) for spec, r in runs.items()}
    missing: dict[str, dict[str, list[int]]] = {}
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    for spec, clients in values.items():
        scores[spec] = {}
        for cid, per_seed in clients.items():
            there = [v for v in per_seed if v is not None]
            absent = [s for s, v in zip(seeds, per_seed) if v is None]
            if absent:
                missing.setdefault(spec, {})[cid] = absent
            if there:
                scores[spec][cid] = {
                    "mean": float(np.mean(there)),
                    "std": float(np.std(there)),
                    "per_seed": per_seed,
                }
    base = values[reference]
    gains = {
        spec: {
            cid: client_gain(per_seed, base[cid], metric)
            for cid, per_seed in clients.items()
            if cid in base and None not in per_seed and None not in base[cid]
        }
        for spec, clients in values.items()
        if spec != reference
    }
    return {
        "metric": metric,
        "reference": reference,
        "seeds": list(seeds),
        "scores": scores,
        "gains": gains,
        "missing": missing,
        "notes": section_notes(reference, seeds, missing),
    }


def section_notes(
    reference: str, seeds: Sequence[int], missing: Mapping[str, Mapping[str, Sequence[int]]]
) -> list[str]:
    """What the per-client gains are, and what they lack (intervals, clients)."""
    n = len(seeds)
    notes = [
        f"Gain over {reference}: the runspec minus {reference} on each client's own test set, "
        f"seed by seed over {n} seed{'s' * (n != 1)}, clients paired by id"
        + (
            ": mean [95% paired-t interval] and wins/ties/losses over seeds; * significant: "
            "the t and the bootstrap intervals both exclude 0 (needs >= 3 seeds)."
            if n >= 2
            else "."
        )
    ]
    if n < 2:
        notes.append(
            "One seed: each gain is a single difference, with no interval and no claim "
            "(intervals need >= 2 paired seeds, a gain is claimed with >= 3); run more seeds."
        )
    for spec, clients in missing.items():
        for cid, absent in clients.items():
            notes.append(
                f"{cid} was not scored by {spec} in seed {', '.join(map(str, absent))}: "
                f"no gain for {cid} where {spec} takes part."
            )
    return notes


def score_rows(
    section: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
    highlight: Collection[str] = (),
    digits: int = 4,
) -> list[dict[str, str]]:
    """One row per client, one column per runspec (``labels`` renames them): the client's
    mean ± std over seeds; ``highlight`` clients in bold (markdown)."""
    labels = labels or {}
    scores = section["scores"]
    rows = []
    for cid in _clients(scores):
        row = {"client": cid}
        for spec, clients in scores.items():
            entry = clients.get(cid)
            row[labels.get(spec, spec)] = (
                "-" if entry is None else f"{entry['mean']:.{digits}f} ± {entry['std']:.{digits}f}"
            )
        rows.append(_bold(row) if cid in highlight else row)
    return rows


def gain_rows(
    section: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
    highlight: Collection[str] = (),
    digits: int = 4,
) -> list[dict[str, str]]:
    """One row per client, one column per runspec but the reference: the paired gain,
    ``+mean [low, high] W/T/L`` (``*`` when significant; the mean alone with one seed);
    ``highlight`` clients in bold (markdown), e.g. the smallest client."""
    labels = labels or {}
    gains = section["gains"]
    rows = []
    for cid in _clients(section["scores"]):
        row = {"client": cid}
        for spec, clients in gains.items():
            gain = clients.get(cid)
            row[labels.get(spec, spec)] = "-" if gain is None else gain_text(gain, digits)
        rows.append(_bold(row) if cid in highlight else row)
    return rows


def gain_text(gain: Mapping[str, Any], digits: int = 4) -> str:
    """``+0.0340 [+0.0100, +0.0580] 3/0/0 *`` (the mean alone with one seed)."""
    text = f"{gain['mean']:+.{digits}f}"
    if "ci_t" not in gain:
        return text
    low, high = gain["ci_t"]
    text += (
        f" [{low:+.{digits}f}, {high:+.{digits}f}] {gain['wins']}/{gain['ties']}/{gain['losses']}"
    )
    return text + (" *" if gain["significant"] else "")


def _clients(scores: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(cid for clients in scores.values() for cid in clients))


def _bold(row: Mapping[str, str]) -> dict[str, str]:
    return {k: f"**{v}**" for k, v in row.items()}
