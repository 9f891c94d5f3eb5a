"""``fedkit compare``: several methods on the same task, partition and seeds, as papers do.

Each RUNSPEC (a plugin name, a combination ``a+b``, or a YAML config path) runs once per
seed into ``OUT/<label>/seed<k>/`` (an ordinary run directory, so an interrupted comparison
continues where it stopped; a folder holding a run of another config is refused, never reused
or overwritten), in this process or in worker processes (:mod:`fedkit_core.parallel`). The
summary (:mod:`fedkit_core.results.compare`) is ``compare.json``, ``compare.md`` and
``compare.tex`` (the table to paste, with readable headers and notes) and the ``compare``
figure (per-round curves with mean ± std bands). Keys of a plugin that a runspec does not
use are ignored for that runspec, in ``--set`` pairs and in the shared ``--config`` file.

A runspec part naming an aggregation mode (``fedavg+fedbuff``) sets ``aggregation``; with
``target`` the time each run takes to reach a score is tabulated and drawn too
(:mod:`fedkit_core.results.timing`, docs/hospitals.md). References are compared beside the
methods: the runspec ``pooled`` (``pooled=true``: one model trained centrally on the union
of the clients' training data, not federated, see :mod:`fedkit_core.engines.pooled`) and
``solo`` (each client alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedkit_core import api
from fedkit_core.config import Config
from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.results import timing
from fedkit_core.results.clients import CLIENTS, clients_section, default_reference
from fedkit_core.results.compare import (
    CONVERGENCE,
    DIFF,
    ENVIRONMENTS_DIFFER,
    MANIFEST,
    REFERENCES_KEY,
    RESERVED,
    TIME_TO_TARGET,
    WARNINGS,
    Comparison,
    aggregate,
    bn_policy,
    environment_differences,
    paired_table,
    runspec_label,
    runspec_layers,
    write_summary,
)
from fedkit_core.results.convergence import convergence
from fedkit_core.results.labels import reference_of
from fedkit_core.results.schema import Results
from fedkit_core.results.store import OwnedOutputs, RunDir, writable, write_json

if TYPE_CHECKING:
    from fedkit_core.parallel import Executor

#: config keys (and key prefixes, ending in ``.``) that make seed k of two runspecs a pair:
#: the same data, split the same way among the same clients
PAIRING_KEYS = ("task.", "partition.", "clients")


def executor_for(name: str, jobs: int = 1, address: str | None = None) -> Executor | None:
    """The executor ``fedkit compare --executor NAME`` names: ``local`` (``jobs`` processes;
    None for one, the runs then run in this process) or ``ray`` (tasks on the cluster at
    ``address``)."""
    if name not in ("local", "ray"):
        raise FedkitError(f"--executor must be local or ray, got {name!r}")
    if name == "local":
        if address is not None:
            raise FedkitError("--address names a Ray cluster: give it with --executor ray")
        from fedkit_core.parallel import LocalProcesses

        return LocalProcesses(jobs) if jobs > 1 else None
    if jobs != 1:
        raise FedkitError("--jobs is for --executor local; Ray places the runs by their CPUs")
    from fedkit_core.cluster import RayCluster

    return RayCluster(address)


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


def resolved_runspecs(
    plan: Sequence[tuple[str, int, Path, list[Mapping[str, Any]]]],
) -> dict[str, Config]:
    """Each runspec's config as its first planned run resolves it: a bad runspec or key
    fails here, before any run starts."""
    configs: dict[str, Config] = {}
    for spec, _, _, layers in plan:
        if spec not in configs:
            configs[spec] = resolve_config(list(layers))[0]
    return configs


def unpaired(configs: Mapping[str, Config]) -> list[str]:
    """One sentence per :data:`PAIRING_KEYS` key on which the runspecs' configs disagree
    (``clients: fedavg 6, fedcb.yaml 10``): their seed k would not be the same experiment,
    so their paired differences would mean nothing."""
    prefixes = tuple(p for p in PAIRING_KEYS if p.endswith("."))
    values = {
        spec: {k: cfg[k] for k in cfg.options if k in PAIRING_KEYS or k.startswith(prefixes)}
        for spec, cfg in configs.items()
    }
    keys = sorted({k for v in values.values() for k in v})
    sentences = []
    for key in keys:
        seen = {spec: v.get(key, "-") for spec, v in values.items()}
        seen = {spec: "default" if x is None else x for spec, x in seen.items()}
        if len({repr(x) for x in seen.values()}) > 1:
            sentences.append(f"{key}: " + ", ".join(f"{s} {x}" for s, x in seen.items()))
    return sentences


def refuse_shared_folders(runspecs: Sequence[str], out: Path) -> None:
    """Exit 2 when two runspecs would run into one folder (``fedkit compare fedavg fedavg``,
    or ``a/x.yaml`` and ``b/x.yaml``): each seed's run would be counted twice."""
    by_label: dict[str, list[str]] = {}
    for spec in runspecs:
        by_label.setdefault(runspec_label(spec), []).append(spec)
    shared = {label: specs for label, specs in by_label.items() if len(specs) > 1}
    if shared:
        text = "; ".join(
            f"{' and '.join(map(repr, s))} -> {out / label}" for label, s in shared.items()
        )
        raise FedkitError(
            f"runspecs given twice or sharing a folder ({text}): each run would be counted "
            "twice; give each method once (rename a YAML file whose name another runspec has)"
        )


def refuse_foreign_runs(plan: Sequence[tuple[str, int, Path, list[Mapping[str, Any]]]]) -> None:
    """Before any training: every planned folder that already holds a run must hold a run of
    the very same config (it is then reused); otherwise exit 2 naming each such folder and
    its differing keys. A comparison never reuses or overwrites a run of another config."""
    problems = []
    for _, _, path, layers in plan:
        if RunDir(path).is_run():
            try:
                cfg = resolve_config(layers)[0]
                RunDir(path).require_config(cfg.nested(), cfg.defaults())
            except FedkitError as err:
                problems.append(str(err))
    if problems:
        raise FedkitError("\n".join(problems))


def finished(path: Path) -> bool:
    """Whether ``path`` holds a complete run (a comparison reuses it, of the same config)."""
    run_dir = RunDir(path)
    try:
        return run_dir.results.is_file() and run_dir.load_results().get("status") == "complete"
    except (OSError, ValueError, FedkitError):  # damaged: not reused (the run says why)
        return False


def compare(
    runspecs: Sequence[str],
    *,
    seeds: Sequence[int],
    out: str | Path,
    base: Sequence[Mapping[str, Any]] = (),
    sets: Mapping[str, Any] | None = None,
    run_one: Callable[[list[Mapping[str, Any]], Path, str, int], Results] | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
    on_done: Callable[[str, int], None] | None = None,
    reference: str | None = None,
    target: str | None = None,
    allow_unpaired: bool = False,
) -> Comparison:
    """Run every runspec for every seed (reusing or continuing runs of the same config) and
    summarise exactly those runs.

    ``base``: config layers shared by all runs (a YAML file, task flags); ``sets``: ``--set``
    pairs, filtered per runspec; ``run_one(layers, out_dir, spec, seed)`` runs or continues one
    (default: :func:`fedkit_core.api.run` with ``reuse=True``, without progress display).
    With ``jobs`` > 1 the runs go to that many worker processes instead
    (:mod:`fedkit_core.parallel`; ``run_one`` is then unused and ``on_done(spec,
    seed)`` reports each finished run); ``executor`` (:mod:`fedkit_core.parallel`, e.g. a
    Ray cluster) runs them instead of ``jobs`` local processes, the same way.
    ``reference``: the runspec each runspec's per-client gain is measured against (default:
    ``solo`` or another local reference when compared, else the first runspec; see
    :mod:`fedkit_core.results.clients`); the paired differences ``diff`` stay against the
    first runspec.
    Folders holding runs of another config, and files in ``out`` that fedkit did not write,
    are refused before anything runs; the summary files of an earlier comparison in ``out``
    (listed in its :data:`MANIFEST`) are removed first, so they never outlive it.
    ``target`` (``final.global.bacc=0.80``): also the time each run took to reach it
    (:mod:`fedkit_core.results.timing`: a table in ``compare.md``, ``compare.json`` key
    ``time_to_target``, the figure ``compare-time``).
    Runspecs that differ in what pairs their seeds (:data:`PAIRING_KEYS`: the task and its
    data, the partition, the number of clients) are refused before anything runs, unless
    ``allow_unpaired``: then the differences are kept under ``warnings`` in ``compare.json``
    and head ``compare.md``.
    """
    goal = timing.parse_target(target) if target is not None else None

    out = Path(out)
    if run_one is None:

        def run_one(layers, path, spec, seed):
            return api.run(layers, out=path, reuse=True)

    for name in RESERVED:
        if name in runspecs:
            raise FedkitError(f"a runspec may not be named {name!r}: compare.json keeps that key")
    if reference is not None and reference not in runspecs:
        raise FedkitError(
            f"--reference {reference} is not one of the compared runspecs: {', '.join(runspecs)}"
        )
    refuse_shared_folders(runspecs, out)
    if not isinstance(jobs, int) or jobs < 1:
        raise FedkitError(f"--jobs must be a whole number of at least 1, got {jobs!r}")
    plan = planned_runs(runspecs, seeds, out, base, sets or {})
    configs = resolved_runspecs(plan)
    differences = unpaired(configs)
    if differences and not allow_unpaired:
        raise FedkitError(
            "these runspecs are not paired (their seed k would not be the same experiment): "
            + "; ".join(differences)
            + ". Make them agree (command-line flags and --set win over runspec files), or "
            "pass --allow-unpaired to compare them anyway with a warning in the table"
        )
    refuse_foreign_runs(plan)
    reused = sum(finished(path) for _, _, path, _ in plan)  # read now: reused, not run
    outputs, labels = OwnedOutputs(out, MANIFEST), {runspec_label(s) for s in runspecs}
    written = writable(out)  # a read-only folder of complete runs is summarised, not written
    if written:
        outputs.claim(labels)  # refuses the user's files; removes only the last summary's
    if executor is None and jobs > 1:
        from fedkit_core.parallel import LocalProcesses

        executor = LocalProcesses(jobs)
    if executor is not None:
        done = executor.run(plan, on_done)
    else:
        done = [run_one(layers, path, spec, seed) for spec, seed, path, layers in plan]
    runs: dict[str, list[Results]] = {}
    for (spec, *_), results in zip(plan, done, strict=True):
        runs.setdefault(spec, []).append(results)
    main = done[-1]["task"]["main_metric"]
    table = aggregate(runs)
    diff = paired_table(table)
    kinds = {spec: reference_of(r[0]["config"]) for spec, r in runs.items()}
    references = {spec: kind for spec, kind in kinds.items() if kind}
    chosen = reference or default_reference(list(runs), kinds)
    clients = clients_section(runs, main, chosen, seeds)
    converged = {spec: convergence(seeds_runs) for spec, seeds_runs in runs.items()}
    bn = {spec: bn_policy(seeds_runs[0]) for spec, seeds_runs in runs.items()}
    times = timing.target_table(runs, goal) if goal is not None else None
    environments = environment_differences(runs)
    found = Comparison(
        table,
        main,
        list(seeds),
        diff,
        references,
        clients,
        converged,
        bn,
        times,
        written,
        differences,
        reused,
        environments,
    )
    if not written:
        return found
    # the formats the comparison asks for; a reused run may have recorded others
    formats = next(iter(configs.values()))["figure_formats"]
    summary = {**table, **({DIFF: diff} if diff else {}), CLIENTS: clients}
    warnings = [f"not paired: {d}" for d in differences]
    warnings += [f"{ENVIRONMENTS_DIFFER}: {e}" for e in environments]
    if warnings:
        summary[WARNINGS] = warnings
    if times is not None:
        summary[TIME_TO_TARGET] = times
    write_json(
        out / "compare.json",
        {**summary, REFERENCES_KEY: references, CONVERGENCE: converged},
    )
    write_summary(
        out,
        table,
        runs,
        main,
        seeds,
        diff,
        references,
        clients,
        converged,
        formats,
        differences,
        environments,
    )
    if times is not None:
        timing.write_target(out, runs, goal, times, formats)
    outputs.record(labels)
    return found
