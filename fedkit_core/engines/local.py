"""The in-process engine: clients are objects in this process, messages are method calls.

It also checkpoints the whole federation after every round (server snapshot plus each
client's persistent state), so ``fedkit resume`` continues after any interruption and ends
with the same results as an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.server import Observer, Server
from fedkit_core.errors import FedkitError
from fedkit_core.messages import Message
from fedkit_core.results.store import write_text, write_torch


class LocalTransport:
    """Delivers messages by calling each client's ``handle``; a raising client becomes a
    failed reply (``error`` set, the exception kept for in-process re-raising)."""

    def __init__(self, clients: dict[str, ClientRuntime], observer: Observer):
        self.clients = clients
        self.observer = observer

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        replies: dict[str, Message] = {}
        for done, (cid, message) in enumerate(messages.items(), start=1):
            try:
                replies[cid] = self.clients[cid].handle(message)
            except Exception as err:  # recorded; the server decides whether the round survives
                text = str(err) if isinstance(err, FedkitError) else f"{type(err).__name__}: {err}"
                replies[cid] = Message(message.kind, error=text, exception=err)
            phase = str(message.scalars.get("query", message.kind))
            self.observer.on_phase(int(message.scalars.get("round", 0)), phase, done, len(messages))
        return replies


class Checkpointer:
    """Round checkpoints under ``directory``; ``latest.json`` is the commit point.

    Each round writes the server snapshot and the state of every client whose state
    changed, then atomically replaces ``latest.json``, then deletes unreferenced files. A
    kill at any moment leaves the previous complete checkpoint intact.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.manifest = self.directory / "latest.json"

    def save(self, server: Server, clients: dict[str, ClientRuntime]) -> None:
        done = server.next_round - 1
        previous = self._read() or {"clients": {}}
        files = {"server": f"server-r{done}.pt", "clients": dict(previous["clients"])}
        write_torch(self.directory / files["server"], server.snapshot())
        for index, (cid, client) in enumerate(clients.items()):
            if client.dirty or cid not in files["clients"]:
                name = f"client{index}-r{done}.pt"
                write_torch(self.directory / name, client.state_dict())
                files["clients"][cid] = name
        write_text(self.manifest, json.dumps({"round": done, **files}, indent=1))
        keep = {files["server"], *files["clients"].values(), self.manifest.name}
        for path in self.directory.glob("*.pt"):
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def _read(self) -> dict[str, Any] | None:
        if not self.manifest.is_file():
            return None
        try:
            return json.loads(self.manifest.read_text())
        except json.JSONDecodeError as err:
            raise FedkitError(f"checkpoint manifest {self.manifest} is corrupt: {err}") from None

    def load(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]] | None:
        """``(server snapshot, {client id: state})`` of the last complete round, or None."""
        files = self._read()
        if files is None:
            return None
        try:
            server = torch.load(self.directory / files["server"], weights_only=False)
            clients = {
                cid: torch.load(self.directory / name, weights_only=False)
                for cid, name in files["clients"].items()
            }
        except Exception as err:  # damaged files raise anything from OSError to pickle errors
            raise FedkitError(
                f"the checkpoint in {self.directory} cannot be read ({type(err).__name__}: {err}); "
                "delete the folder to start the run again"
            ) from None
        return server, clients
