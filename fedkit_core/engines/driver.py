"""What every engine does around the server's rounds, whatever its transport: set up (or
resume from the checkpoint), checkpoint the server and write the running results after each
round, write the final results and plots."""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy
import torch

from fedkit_core.contract.messages import Message
from fedkit_core.engines.checkpoint import RESUME_KEY, ServerCheckpoints
from fedkit_core.engines.server import Server, Transport
from fedkit_core.fileio import write_text
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.results import figure_process
from fedkit_core.results.plots import RUN_FIGURES, figure_formats, figure_paths, plot_run
from fedkit_core.results.schema import Results, build_results, has_test, metrics_csv
from fedkit_core.results.store import ResultsWriter, RunDir, config_diff, config_hash

log = logging.getLogger("fedkit")


def drive(
    server: Server,
    transport: Transport,
    clients: Iterable[str],
    plugin_set: PluginSet,
    run_dir: RunDir | None,
    *,
    resume: bool,
    started: float,
    before_write: Callable[[Server], None] | None = None,
) -> Results:
    """Set up ``server`` and its ``clients`` (from the last checkpoint with ``resume``), run
    the remaining rounds and return the results. ``started``: when the engine began
    (``time.perf_counter()``), so that setting up counts in the run's wall time;
    ``before_write`` is called before each write of the results (after every round and at
    the end), to add what the engine learnt meanwhile (a deployment's node events)."""
    store = (
        ServerCheckpoints(run_dir.checkpoint) if run_dir and server.config["checkpoint"] else None
    )
    saved = store.load() if store is not None and resume else None
    if resume and saved is None and run_dir.results.is_file() and run_dir.load_results()["rounds"]:
        log.warning("no checkpoint in %s: the run starts again from round 1", run_dir.checkpoint)
    server.setup(priors=saved["priors"] if saved else None)
    done = saved["next_round"] - 1 if saved else None
    server.setup_clients(_Resuming(transport, done), clients)
    if saved:
        server.restore(saved)
        _record_edit(server, store.config(), done)
        server.unverified += store.accepted()  # fedkit resume --accept-unverified
    server.seconds += time.perf_counter() - started
    writer = ResultsWriter()

    def after_round(srv: Server) -> None:
        if before_write is not None:
            before_write(srv)
        if store is not None:
            store.save(srv)
        write_results("running", srv, plugin_set, run_dir, writer)

    server.run(transport, on_round=after_round)
    if before_write is not None:
        before_write(server)
    return finish_run(server, plugin_set, run_dir, writer)


def _record_edit(server: Server, before: dict | None, done: int) -> None:
    """Note in the results from which round on the run used an edited config (an edit
    ``fedkit resume`` accepted): the rounds up to ``done`` ran under ``before``."""
    after = server.config.nested()
    if before is None or config_hash(before) == config_hash(after):
        return
    server.config_edits.append(
        {
            "from_round": done + 1,
            "changes": config_diff(before, after),
            "config_sha256": config_hash(after),
        }
    )


class _Resuming:
    """``transport`` whose setup messages tell clients the round the run continues after."""

    def __init__(self, transport: Transport, done: int | None):
        self.transport = transport
        self.done = done

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        if self.done is not None:
            messages = {
                cid: Message(m.kind, m.arrays, {**m.scalars, RESUME_KEY: self.done})
                for cid, m in messages.items()
            }
        return self.transport.send(messages)


def write_results(
    status: str,
    server: Server,
    plugin_set: PluginSet,
    run_dir: RunDir | None,
    writer: ResultsWriter,
) -> Results:
    """The results of ``server``'s rounds so far, written to ``run_dir`` (if any) by
    ``writer`` (the same one every round, so that each round is serialised once)."""
    results = build_results(
        status=status,
        config=server.config.nested(),
        plugins=plugin_set.run_versions(),
        task=server.task.to_dict(),
        device=str(server.ctx.device),
        records=server.records,
        events=server.events,
        nodes=server.nodes,
        wall_seconds=server.seconds,
        setup_bytes=server.setup_traffic,
        priors=server.ctx.priors,
        privacy=server.strategy.summary(server.records),
        normalisation=server.normalisation,
        config_edits=server.config_edits,
        unverified=server.unverified,
        environment=run_environment(),
    )
    if run_dir is not None:
        writer.write(run_dir, results)
    return results


def run_environment() -> dict[str, Any]:
    """What a run's numbers depend on besides its config, data and code (``results.json``
    ``environment``): the versions of torch, numpy and Python, the CPU kernels torch
    dispatches to and its intra-op thread count in this process. The same seed repeats a run
    bit for bit only where these are the same: kernels sum in an order that depends on the
    threads and the instruction set, and training carries a last-bit difference into the
    third digit within tens of rounds (docs/plugins/fed-lwr.md, "Why FedAvg's numbers on
    DRIVE + CHASE_DB1 moved")."""
    return {
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


def write_missing_outputs(run_dir: RunDir, results: Results) -> list[str]:
    """Write what a complete run lacks beside its results.json (metrics.csv, the figures):
    a run killed right after its results were written has none of them. Returns the
    names written; a folder that cannot be written is left as it is, with a warning."""
    missing = [] if run_dir.metrics_csv.is_file() else [run_dir.metrics_csv.name]
    formats = figure_formats(results.get("config"))
    figures = [p for name in RUN_FIGURES for p in figure_paths(run_dir.path / name, formats)]
    if any(has_test(r) for r in results.rounds) and not all(p.is_file() for p in figures):
        missing.append("figures")
    if not missing:
        return []
    try:
        if run_dir.metrics_csv.name in missing:
            write_text(run_dir.metrics_csv, metrics_csv(results.rounds))
        if "figures" in missing:
            plot_run(results, run_dir.path)
    except OSError as err:
        log.warning("%s lacks %s and cannot be written (%s)", run_dir.path, missing, err)
        return []
    return missing


def finish_run(
    server: Server, plugin_set: PluginSet, run_dir: RunDir | None, writer: ResultsWriter
) -> Results:
    """Write the complete results and their plots (by the figure process where the command
    started one: :mod:`fedkit_core.results.figure_process`), then tell the observer."""
    results = write_results("complete", server, plugin_set, run_dir, writer)
    if run_dir is not None:
        figure_process.plot_run(results, run_dir.path)
    server.observer.on_end(results, run_dir.path if run_dir else None)
    return results
