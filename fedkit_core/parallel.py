"""Run a comparison's runs in parallel processes (``fedkit compare --jobs N``).

Each run is an ordinary run directory written by :func:`fedkit_core.api.run` in a fresh
(spawned, not forked: OpenMP is not fork-safe) process, so an interrupted parallel comparison
continues like a serial one. The cores are split between the jobs (``cores // jobs`` torch
threads each): a run's numbers can differ from a serial run's in the last digits, as
floating-point reductions depend on the thread count; runs at the same thread count are
bitwise identical however they were scheduled. A worker ends itself when the comparison
that started it is gone (killed, even with SIGKILL), and the resource tracker with it.

Where the runs go is an :class:`Executor`: :class:`LocalProcesses` here, or
:class:`fedkit_core.cluster.RayCluster` (Ray tasks on an existing cluster); both hand back the
runs' results the same way (:func:`collect`), so a comparison is planned, resumed and
summarised alike whichever runs it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Protocol

from fedkit_core.errors import FedkitError
from fedkit_core.results.schema import Results

Plan = Sequence[tuple[str, int, Path, list[Mapping[str, Any]]]]
#: how often a worker checks that the comparison that started it is still there
WATCH_SECONDS = 0.5
OnDone = Callable[[str, int], None] | None


class Executor(Protocol):
    """Runs every run of a comparison's plan somewhere; their results in plan order."""

    def run(self, plan: Plan, on_done: OnDone = None) -> list[Results]: ...


class LocalProcesses:
    """``jobs`` worker processes on this machine (``fedkit compare --jobs``)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def run(self, plan: Plan, on_done: OnDone = None) -> list[Results]:
        return run_parallel(plan, self.jobs, on_done)


def threads_per_job(jobs: int) -> int:
    """Torch threads for each of ``jobs`` parallel runs: the cores split evenly, at least 1."""
    return max(1, (os.cpu_count() or 1) // jobs)


def _start_worker(threads: int, parent: int) -> None:
    import torch

    torch.set_num_threads(threads)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    """End this worker once the comparison that started it (process ``parent``) is gone:
    killed, even by SIGKILL, which runs no clean-up, it leaves its workers running under
    another parent, and with them the resource tracker, whose pipe they hold open. What a
    worker has written stays valid (every file is written atomically), as after any kill."""
    while os.getppid() == parent:
        time.sleep(WATCH_SECONDS)
    os._exit(1)


def run_child(layers: list[Mapping[str, Any]], path: Path) -> str | None:
    """One run in a worker process; a user error comes back as its message."""
    from fedkit_core import api

    try:
        api.run(layers, out=path, reuse=True)
    except FedkitError as err:
        return str(err)
    return None


def run_parallel(plan: Plan, jobs: int, on_done: OnDone = None) -> list[Results]:
    """Every run of ``plan`` in ``jobs`` worker processes; their results in plan order.

    ``on_done(runspec, seed)`` is called as each run finishes (for a progress display). The
    first failing run stops the comparison: runs not yet started are cancelled, and its error
    is raised naming the run (finished runs stay in their folders and are reused next time).
    """
    context = get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(plan)),
        mp_context=context,
        initializer=_start_worker,
        initargs=(threads_per_job(jobs), os.getpid()),
    ) as pool:
        futures = {
            pool.submit(run_child, layers, path): (spec, seed) for spec, seed, path, layers in plan
        }
        return collect(plan, futures, on_done, Future.cancel)


def collect(
    plan: Plan,
    futures: Mapping[Future, tuple[str, int]],
    on_done: OnDone,
    cancel: Callable[[Future], Any],
) -> list[Results]:
    """Wait for the runs' futures (each :func:`run_child`'s answer), reporting each finished
    run; the first failing run cancels the others (``cancel``) and is raised naming it."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            spec, seed = futures[future]
            error = future.result()  # a bug in a run re-raises here, with its traceback
            if error is not None:
                for other in pending:
                    cancel(other)
                raise FedkitError(f"{spec} seed {seed}: {error}")
            if on_done is not None:
                on_done(spec, seed)
    return [Results.load(path) for _, _, path, _ in plan]
