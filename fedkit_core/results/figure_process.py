"""A run's figures drawn by a helper process, off the command's critical path (``fedkit
run``, ``fedkit resume``).

:func:`drawing_in_background` forks the helper when the command starts, before torch is
imported (so forking is safe, and the child never loads torch): it imports matplotlib while
the command imports torch and loads the data, on a core those single-threaded steps leave
idle. :func:`plot_run` hands it the complete results instead of drawing them here and waits
for its answer, so the figures are written (atomically, as
:func:`fedkit_core.results.plots.plot_run` writes them) before trackers log them and before
the command returns, and a figure that failed raises there as it would have in-process.
Outside the block (the library, ``fedkit compare``) figures are drawn in the calling process.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

#: the pipe to this process's helper while a :func:`drawing_in_background` block runs
_helper: list[Connection] = []


def _serve(pipe: Connection) -> None:
    """The helper: import the plotting stack, then draw each run it is sent, answering each
    with ``None`` or the exception it raised."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    from fedkit_core.results import plots

    plots.warm_up()
    while True:
        job = pipe.recv()
        try:
            plots.plot_run(*job)
            pipe.send(None)
        except Exception as err:  # handed back, raised in the command
            pipe.send(err)


@contextmanager
def drawing_in_background() -> Iterator[None]:
    """Run the block with a figure helper process (ended with the block)."""
    if _helper or "fork" not in multiprocessing.get_all_start_methods():
        yield  # nested (the outer block's helper draws), or no fork here (Windows): in-process
        return
    context = multiprocessing.get_context("fork")
    pipe, theirs = context.Pipe()
    helper = context.Process(target=_serve, args=(theirs,), daemon=True, name="fedkit-figures")
    helper.start()
    theirs.close()
    _helper.append(pipe)
    try:
        yield
    finally:
        _helper.clear()
        helper.terminate()  # idle (every figure it was sent is answered) or still importing
        helper.join()
        pipe.close()


def plot_run(results: Mapping[str, Any], directory: Path) -> None:
    """A run's figures, drawn by the helper when a :func:`drawing_in_background` block runs,
    else here; either way they are written when this returns (trackers log them next), and
    a figure that failed raises here."""
    answer: BaseException | None = None
    if _helper:
        try:
            _helper[0].send((dict(results), Path(directory)))
            answer = _helper[0].recv()
        except (OSError, EOFError):  # the helper is gone (it could not start): drawn here
            _helper.clear()
        else:
            if answer is not None:
                raise answer
            return
    from fedkit_core.results.plots import plot_run as draw

    draw(results, directory)
