"""A run's figures drawn by a helper process, off the command's critical path (``fedkit
run``, ``fedkit resume``).

:func:`drawing_in_background` forks the helper when the command starts, before torch is
imported (so forking is safe, and the child never loads torch): it imports matplotlib while
the command imports torch and loads the data, on a core those single-threaded steps leave
idle. :func:`plot_run` hands it the complete results instead of drawing them here, and the
command waits for its figures when the block ends: when the command returns, the run folder
is complete (each figure written atomically, as :func:`fedkit_core.results.plots.plot_run`
writes it), and a figure that failed raises here as it would have in-process. Outside the
block (the library, ``fedkit compare``) figures are drawn in the calling process.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from fedkit_core.errors import FedkitError

#: this process's helper while a :func:`drawing_in_background` block runs: its pipe, and the
#: folders whose figures it was sent
_helper: list[tuple[Connection, list[Path]]] = []


def _serve(pipe: Connection) -> None:
    """The helper: import the plotting stack, then draw each run it is sent until ``None``,
    answering each with ``None`` or the exception it raised."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    from fedkit_core.results import plots

    plots.warm_up()
    while (job := pipe.recv()) is not None:
        try:
            plots.plot_run(*job)
            pipe.send(None)
        except Exception as err:  # handed back, raised in the command
            pipe.send(err)


@contextmanager
def drawing_in_background() -> Iterator[None]:
    """Run the block with a figure helper process, then wait for every figure it was sent
    (raising the first error, unless the block raised one)."""
    if _helper or "fork" not in multiprocessing.get_all_start_methods():
        yield  # nested (the outer block's helper draws), or no fork here (Windows): in-process
        return
    context = multiprocessing.get_context("fork")
    pipe, theirs = context.Pipe()
    helper = context.Process(target=_serve, args=(theirs,), daemon=True, name="fedkit-figures")
    helper.start()
    theirs.close()
    sent: list[Path] = []
    _helper.append((pipe, sent))
    try:
        yield
    finally:
        _helper.clear()
        if not sent:  # nothing to draw (the command failed early): no wait for its imports
            helper.terminate()
        errors = _wait(pipe, sent) if sent else []
        pipe.close()
        helper.join()
    if errors:
        raise errors[0]


def _wait(pipe: Connection, sent: list[Path]) -> list[BaseException]:
    """Every answer of the helper, then its end; a helper that died is an error naming the
    folders it left without figures."""
    try:
        answers = [pipe.recv() for _ in sent]
        pipe.send(None)
    except (EOFError, OSError):
        folders = ", ".join(map(str, sent))
        return [FedkitError(f"the figure process ended early: draw {folders} with fedkit report")]
    return [error for error in answers if error is not None]


def plot_run(results: Mapping[str, Any], directory: Path) -> None:
    """A run's figures: sent to the helper when a :func:`drawing_in_background` block runs
    (the block waits for them), else drawn here."""
    if _helper:
        pipe, sent = _helper[0]
        try:
            pipe.send((dict(results), Path(directory)))
            sent.append(Path(directory))
            return
        except OSError:  # the helper is gone (it could not start): drawn here instead
            pass
    from fedkit_core.results.plots import plot_run as draw

    draw(results, directory)
