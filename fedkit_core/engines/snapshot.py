"""The one snapshot format of a client, and safe (de)serialisation of snapshots.

A client's snapshot is its persistent state (:meth:`ClientRuntime.state_dict`: private
model entries, optimiser state, plugin state) plus what a ``query`` after ``fit`` needs
(the locally trained shared weights, the round, the client's random stream). The
checkpoints of every engine and a Flower node's ``Context.state`` hold exactly this.

Snapshots are tensors in plain containers (dict, list, tuple, str, numbers, None). They are
read with ``torch.load(weights_only=True)``, which refuses pickled objects without running
their code: a damaged or planted file is a :class:`FedkitError`, never an execution.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from fedkit_core.errors import FedkitError
from fedkit_core.fileio import write_torch
from fedkit_core.hooks.context import ClientContext


class Stateful(Protocol):
    """A client whose state a snapshot holds (a
    :class:`~fedkit_core.engines.client.ClientRuntime`): typed here so that the snapshot
    does not import the client that uses it."""

    ctx: ClientContext
    optimizer: torch.optim.Optimizer | None

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def client_snapshot(runtime: Stateful) -> dict[str, Any]:
    """The client's snapshot (see the module docstring); resets ``runtime.dirty``."""
    return {
        "client": runtime.state_dict(),
        "shared": runtime.ctx.model.shared_state(),
        "round": runtime.ctx.round,
        "rng": runtime.ctx.rng.get_state(),
        "client_id": runtime.ctx.id,  # a folder copied over another client's is refused
    }


def restore_client(runtime: Stateful, snapshot: Mapping[str, Any]) -> None:
    """Bring a set-up client to the state of ``snapshot``."""
    runtime.optimizer = None
    runtime.load_state_dict(snapshot["client"])
    runtime.ctx.model.load_shared(snapshot["shared"])
    runtime.ctx.round = snapshot["round"]
    runtime.ctx.rng.set_state(snapshot["rng"])


def to_bytes(snapshot: Mapping[str, Any]) -> bytes:
    """A snapshot (client or server) serialised with ``torch.save``."""
    buffer = io.BytesIO()
    torch.save(dict(snapshot), buffer)
    return buffer.getvalue()


def from_bytes(blob: bytes, what: str = "snapshot") -> dict[str, Any]:
    """The snapshot serialised in ``blob``; anything but tensors in plain containers is
    refused with a FedkitError naming ``what``."""
    return _load(io.BytesIO(blob), what)


def write_snapshot(path: Path, snapshot: Mapping[str, Any]) -> None:
    """Write a snapshot to ``path`` atomically (a reader never sees half a file)."""
    write_torch(path, dict(snapshot))


def read_snapshot(path: Path) -> dict[str, Any]:
    """The snapshot in the file ``path`` (see :func:`from_bytes`)."""
    return _load(path, f"checkpoint file {path}")


def _load(source: Any, what: str) -> dict[str, Any]:
    try:
        snapshot = torch.load(source, weights_only=True)
    except pickle.UnpicklingError:  # torch's text suggests weights_only=False: not for us
        raise FedkitError(
            f"{what} is corrupt or not a fedkit snapshot: it holds objects other than tensors "
            "and plain values, which are refused (loading them could run code)"
        ) from None
    except Exception as err:  # truncated or damaged files raise anything from OSError on
        raise FedkitError(
            f"{what} is corrupt or not a fedkit snapshot ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(snapshot, dict):
        raise FedkitError(f"{what} is corrupt: it holds a {type(snapshot).__name__}, not a dict")
    return snapshot
