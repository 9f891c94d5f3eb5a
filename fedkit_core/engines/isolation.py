"""One isolation mechanism for a client that must be stoppable: a forked worker process.

Every engine runs a client that may hang or crash the same way (``client_timeout``): the
local engine's :class:`~fedkit_core.engines.workers.WorkerTransport`, the Flower ClientApp
in a simulation (Ray workers or the in-process backend) and on a deployed SuperNode
(:mod:`fedkit_core.engines.flower.node`). An :class:`Isolated` worker is a child forked from
the process that holds the client (so it inherits the data and the client as built, with
no pickling), kept from one request to the next, that answers ``answer(request)`` for
each request it is sent. The parent waits for the answer at most ``timeout`` seconds:

* an answer comes back as the value ``answer`` returned (requests and answers are pickled
  through a pipe, plain CPU tensors as NumPy arrays);
* a worker that misses the timeout is killed; one whose process exits (``os._exit``, a
  segfault, the kernel's OOM killer) is noticed at once; either way :class:`Stopped` says
  why, in words the run's events show, and the caller starts a fresh worker for its next
  request (the failed client's state is the caller's to restore).

``answer`` must turn a client's exceptions into its reply: what escapes it ends the
worker (the parent then sees an exit).
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import gc
import io
import multiprocessing
import pickle
import signal
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, ClassVar

import torch


class Stopped(Exception):
    """An isolated worker gave no answer: it missed its timeout (and was killed) or its
    process exited. The message is the failed reply's text."""


def timeout_text(timeout: float) -> str:
    return f"no reply within {timeout:g} s (client_timeout)"


def exit_text(code: int | None) -> str:
    """The failure of a worker whose process ended with exit ``code`` (negative: a signal)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the client's process was killed by {name}"
    return f"the client's process exited (exit code {code})"


class Isolated:
    """A forked child process answering ``answer(request)`` one request at a time (see the
    module docstring). ``threads``: torch's intra-op threads in the child (default: the
    parent's at the fork). Call :meth:`close` (or :meth:`kill`) when done with it."""

    _live: ClassVar[weakref.WeakSet[Isolated]] = weakref.WeakSet()

    def __init__(
        self,
        answer: Callable[[Any], Any],
        *,
        threads: int | None = None,
        name: str = "fedkit-worker",
    ):
        ours, theirs = multiprocessing.Pipe()
        # the child closes every parent end of the pipes, so a worker sees EOF when the
        # parent goes, not when its last sibling does
        parent_ends = [ours, *(w.conn for w in Isolated._live if not w.conn.closed)]
        threads = threads or torch.get_num_threads()
        # the child's garbage collector leaves the parent's objects alone: a collection
        # would write to every page of the parent's heap (copy on write: 0.5 s of CPU)
        gc.freeze()
        try:
            self.process = multiprocessing.get_context("fork").Process(
                target=_serve, args=(theirs, parent_ends, answer, threads), name=name, daemon=True
            )
            self.process.start()
        finally:
            gc.unfreeze()
        theirs.close()
        self.conn = ours
        Isolated._live.add(self)

    # the parts, for a caller that waits on several workers at once (WorkerTransport)

    def send(self, request: Any) -> None:
        """Hand ``request`` to the worker; :class:`Stopped` if its process is gone."""
        try:
            self.conn.send_bytes(dumps(request))
        except OSError:
            raise Stopped(self._ended()) from None

    @property
    def waitables(self) -> list[Any]:
        """What :func:`multiprocessing.connection.wait` watches: an answer or an exit."""
        return [self.conn, self.process.sentinel]

    def receive(self) -> Any:
        """The worker's answer (call when :attr:`waitables` are ready); :class:`Stopped`
        if its process exited instead."""
        if self.conn.poll():
            try:
                return pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):  # the process died before answering
                pass
        raise Stopped(self._ended())

    # the whole exchange

    def ask(self, request: Any, timeout: float | None) -> Any:
        """The answer to ``request`` within ``timeout`` seconds (None: no limit), or
        :class:`Stopped` (the worker is then gone)."""
        self.send(request)
        if not wait(self.waitables, timeout):
            self.kill()
            raise Stopped(timeout_text(timeout or 0.0))
        return self.receive()

    def kill(self) -> None:
        """End the worker at once."""
        self.process.kill()
        self.process.join()
        self.conn.close()

    def close(self, wait: bool = True) -> None:
        """Ask the worker to end and wait for it (a few seconds at most), or with
        ``wait=False`` kill it at once."""
        if not wait:
            self.process.kill()
        with contextlib.suppress(OSError):
            self.conn.send_bytes(dumps(None))
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()

    def _ended(self) -> str:
        self.process.join(timeout=5)
        if self.process.is_alive():  # a broken pipe, the process still there: end it
            self.process.kill()
            self.process.join()
        self.conn.close()
        return exit_text(self.process.exitcode)


# ---------------------------------------------------------------------------- the child


def _serve(
    conn: Connection, parent_ends: list[Connection], answer: Callable[[Any], Any], threads: int
) -> None:
    """The worker process: answer requests in a new thread until ``None`` or EOF.

    GNU OpenMP (torch's intra-op threads) keeps its thread team per thread and is not
    fork-safe: a forked process's main thread inherits a team whose threads do not exist
    and hangs in its first parallel op. A thread started after the fork builds its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    _die_with_parent()
    for end in parent_ends:
        end.close()
    server = threading.Thread(target=_answer_all, args=(conn, answer, threads))
    server.start()
    server.join()


def _answer_all(conn: Connection, answer: Callable[[Any], Any], threads: int) -> None:
    torch.set_num_threads(threads)
    while True:
        try:
            request = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if request is None:
            return
        reply = answer(request)
        try:
            conn.send_bytes(dumps(reply))
        except OSError:  # the parent is gone
            return


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (killed by a signal, it cannot
    stop its workers); elsewhere the closed pipe ends them when idle."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


_PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------------------- pickling


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, plain CPU tensors as numpy arrays (a memory copy; torch's own
    pickling of a tensor goes through ``torch.save`` and took 2-3x as long for a model)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _reduce_tensor(tensor: torch.Tensor) -> Any:
    plain = (
        type(tensor) is torch.Tensor
        and tensor.layout == torch.strided
        and tensor.device.type == "cpu"
        and tensor.dtype in _NUMPY_DTYPES
        and not (tensor.requires_grad or tensor.is_conj() or tensor.is_neg())
    )
    if not plain:
        return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return torch.from_numpy, (tensor.numpy(),)


_NUMPY_DTYPES = {
    torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool,
}  # fmt: skip


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}
