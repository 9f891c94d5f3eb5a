"""Checkpoints of a run, each party keeping its own: what ``fedkit resume`` continues from.

* The **server** writes its snapshot after every round, then atomically replaces
  ``latest.json`` (``{"round": R, "server": "server-rR.pt"}``), the commit point.
* Each **client** writes its own snapshot (:mod:`fedkit_core.engines.snapshot`) to its own
  folder, ``clients/<client id>/r<round>.pt``, after every message that changed its state,
  keeping its newest two rounds: whenever the run is killed, every client still holds its
  state as of the server's last committed round.

On resume the server restores round R and its setup message carries R
(:data:`RESUME_KEY`); each client restores its newest snapshot of a round <= R (none: its
state never changed). Nothing about a client's state passes through the server, so the same
scheme serves the local engine and Flower nodes (whose folders, in a simulation, lie under
the run's ``checkpoint`` folder).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.server import Server
from fedkit_core.engines.snapshot import (
    client_snapshot,
    read_snapshot,
    restore_client,
    write_snapshot,
)
from fedkit_core.errors import FedkitError
from fedkit_core.messages import Message
from fedkit_core.results.store import write_text

#: the setup message's scalar naming the round a resumed run continues after
RESUME_KEY = "fedkit.resume_round"
_CLIENT_FILE = re.compile(r"r(\d+)\.pt")


class ServerCheckpoints:
    """The server's snapshots under ``directory``; ``latest.json`` is the commit point."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.manifest = self.directory / "latest.json"

    def save(self, server: Server) -> None:
        """Write the server's snapshot after its last completed round, then commit it."""
        done = server.next_round - 1
        name = f"server-r{done}.pt"
        write_snapshot(self.directory / name, server.snapshot())
        write_text(self.manifest, json.dumps({"round": done, "server": name}, indent=1))
        _prune(self.directory, "server-r*.pt", keep={name})

    def load(self) -> dict[str, Any] | None:
        """The server snapshot of the last committed round, or None when there is none."""
        if not self.manifest.is_file():
            return None
        try:
            name = json.loads(self.manifest.read_text())["server"]
        except (ValueError, KeyError, TypeError) as err:  # JSON and UTF-8 errors are ValueErrors
            raise self._corrupt(f"{type(err).__name__}: {err}") from None
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise self._corrupt(f"it names {name!r}, not a file of this folder")
        return read_snapshot(self.directory / name)

    def _corrupt(self, reason: str) -> FedkitError:
        return FedkitError(
            f"checkpoint manifest {self.manifest} is corrupt ({reason}); "
            "delete the checkpoint folder to start the run again"
        )


class ClientCheckpoints:
    """One client's snapshots in its own folder: ``r<round>.pt``, the newest two rounds."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    @classmethod
    def of(cls, directory: Path, client_id: str) -> ClientCheckpoints:
        """The folder of ``client_id`` in a run's checkpoint ``directory``."""
        name = quote(client_id, safe="")  # no separators; a leading dot is escaped too
        return cls(Path(directory) / "clients" / re.sub(r"^\.", "%2E", name))

    def save(self, snapshot: dict[str, Any]) -> None:
        """Write the snapshot of its round; keep only the newest two rounds."""
        write_snapshot(self.folder / f"r{snapshot['round']}.pt", snapshot)
        rounds = sorted(self._rounds(), reverse=True)
        _prune(self.folder, "r*.pt", keep={f"r{r}.pt" for r in rounds[:2]})

    def load(self, upto: int) -> dict[str, Any] | None:
        """The newest snapshot of a round <= ``upto``, or None."""
        rounds = [r for r in self._rounds() if r <= upto]
        return read_snapshot(self.folder / f"r{max(rounds)}.pt") if rounds else None

    def _rounds(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        found = (_CLIENT_FILE.fullmatch(p.name) for p in self.folder.iterdir())
        return [int(m.group(1)) for m in found if m]


def checkpoint_client(
    runtime: ClientRuntime, message: Message, store: ClientCheckpoints | None
) -> dict[str, Any] | None:
    """After ``runtime`` handled ``message``: restore it when the message is a resuming
    setup, snapshot it when its state changed. Returns the snapshot restored or taken (for a
    Flower node's context), or None."""
    if message.kind == "setup":
        upto = message.scalars.get(RESUME_KEY)
        if upto is None:
            return None
        if store is None:
            raise FedkitError("this client keeps no checkpoints, so it cannot resume the run")
        snapshot = store.load(int(upto))
        if snapshot is not None:
            restore_client(runtime, snapshot)
        return snapshot
    if not runtime.dirty:
        return None
    snapshot = client_snapshot(runtime)
    if store is not None:
        store.save(snapshot)
    return snapshot


def _prune(folder: Path, pattern: str, keep: set[str]) -> None:
    """Delete the files matching ``pattern`` not in ``keep``, and temporary files a killed
    writer left behind (writes to one folder never overlap)."""
    for path in [*folder.glob(pattern), *folder.glob(".*.tmp")]:
        if path.name not in keep:
            path.unlink(missing_ok=True)
