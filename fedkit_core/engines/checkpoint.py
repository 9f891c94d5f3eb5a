"""Checkpoints of a run, each party keeping its own: what ``fedkit resume`` continues from.

* The **server** writes its snapshot after every round, then atomically replaces
  ``latest.json`` (``{"round": R, "server": "server-rR.pt", "sha256": ..., "config": ...}``),
  the commit point: it holds the snapshot's SHA-256 and the config the committed rounds
  ran under.
* Each **client** writes its own snapshot (:mod:`fedkit_core.engines.snapshot`) to its own
  folder, ``clients/<client id>/r<round>.pt``, after every message that changed its state,
  keeping its newest two rounds, and then their SHA-256 in ``digests.json`` beside them:
  whenever the run is killed, every client still holds its state as of the server's last
  committed round.

A file that no longer matches the digest written after it (a flipped bit, a copy cut
short, an edit) is refused on resume, naming the file and the round to restart from,
instead of continuing silently from damaged state; so is a snapshot that the digests list
but is gone, and a client folder that ``latest.json`` lists but is gone. Digests that are
missing (no ``sha256`` in ``latest.json``, no ``digests.json``) are refused by ``fedkit
resume`` (:meth:`ServerCheckpoints.unverified`): this fedkit always writes them; a run of
an older one is resumed with ``--accept-unverified``, which results.json records.

On resume the server restores round R and its setup message carries R
(:data:`RESUME_KEY`); each client restores its newest snapshot of a round <= R (none: its
state never changed). Nothing about a client's state passes through the server, so the same
scheme serves the local engine and Flower nodes (whose folders, in a simulation, lie under
the run's ``checkpoint`` folder).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fedkit_core.contract.messages import Message
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.server import Server
from fedkit_core.engines.snapshot import (
    client_snapshot,
    read_snapshot,
    restore_client,
    write_snapshot,
)
from fedkit_core.errors import FedkitError
from fedkit_core.fileio import MAX_NAME_BYTES, folder_name, write_text
from fedkit_core.privacy.layer import hides_sampling

log = logging.getLogger("fedkit")

#: the setup message's scalar naming the round a resumed run continues after
RESUME_KEY = "fedkit.resume_round"
_CLIENT_FILE = re.compile(r"r(\d+)\.pt")
#: a client folder's record of its snapshots' SHA-256, written after each snapshot
DIGESTS = "digests.json"
#: the checkpoint folder's note of files resumed without digests (--accept-unverified)
ACCEPTED = "accepted-unverified.json"


def file_digest(path: Path) -> str:
    """The SHA-256 of the file ``path`` (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, expected: str | None, rnd: int, record: Path, checkpoints: Path) -> None:
    """Refuse ``path``, a checkpoint of round ``rnd`` in the run's folder ``checkpoints``,
    unless its SHA-256 is ``expected``: the digest ``record`` holds for it (None: none)."""
    if expected is not None and path.is_file() and file_digest(path) == expected:
        return
    if not path.is_file():
        why = f"it is gone, though {record} records it"
    elif expected is None:
        why = f"no digest of it is recorded in {record}"
    else:
        why = f"its SHA-256 is not the one recorded in {record} when it was written"
    raise FedkitError(
        f"checkpoint file {path} (round {rnd}) is damaged or was changed since it was "
        f"written ({why}), so the run cannot continue from round {rnd}, and no older "
        f"round is kept: restart it from round 1 by deleting {checkpoints} and running "
        f"`fedkit resume {checkpoints.parent}` again"
    )


class ServerCheckpoints:
    """The server's snapshots under ``directory``; ``latest.json`` is the commit point."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.manifest = self.directory / "latest.json"

    def save(self, server: Server) -> None:
        """Write the server's snapshot after its last completed round, then commit it with
        the snapshot's digest and the config the rounds ran under."""
        done = server.next_round - 1
        name = f"server-r{done}.pt"
        write_snapshot(self.directory / name, server.snapshot())
        manifest = {
            "round": done,
            "server": name,
            "sha256": file_digest(self.directory / name),
            "config": server.config.nested(),
            # the client folders holding snapshots: one gone is refused on resume
            "clients": sorted(f.folder.name for f in self._client_folders() if f.holds_snapshots()),
        }
        write_text(self.manifest, json.dumps(manifest, indent=1, default=str))
        _prune(self.directory, "server-r*.pt", keep={name})
        (self.directory / ACCEPTED).unlink(missing_ok=True)  # what it accepted is replaced

    def _read(self) -> dict[str, Any] | None:
        """``latest.json``, checked (None when there is none)."""
        if not self.manifest.is_file():
            return None
        try:
            manifest = json.loads(self.manifest.read_text())
            name, rnd = manifest["server"], manifest["round"]
        except (ValueError, KeyError, TypeError) as err:  # JSON and UTF-8 errors are ValueErrors
            raise self._corrupt(f"{type(err).__name__}: {err}") from None
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise self._corrupt(f"it names {name!r}, not a file of this folder")
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
            raise self._corrupt(f"its round is {rnd!r}")
        digest, config = manifest.get("sha256"), manifest.get("config")
        if not (digest is None or isinstance(digest, str)) or not (
            config is None or isinstance(config, dict)
        ):
            raise self._corrupt("its sha256 or config is of the wrong type")
        clients = manifest.get("clients", [])
        if not isinstance(clients, list) or not all(
            isinstance(c, str) and Path(c).name == c and c not in ("", ".", "..") for c in clients
        ):
            raise self._corrupt("its clients are not a list of folder names")
        return manifest

    def round(self) -> int | None:
        """The last committed round (None: no checkpoint)."""
        manifest = self._read()
        return None if manifest is None else manifest["round"]

    def config(self) -> dict[str, Any] | None:
        """The config the committed rounds ran under (None: no checkpoint, or one written
        before the manifest recorded it)."""
        manifest = self._read()
        return None if manifest is None else manifest.get("config")

    def load(self) -> dict[str, Any] | None:
        """The server snapshot of the last committed round, or None when there is none;
        its file is checked against its digest, and so is every client's snapshot of that
        round under this folder (a simulation's nodes keep theirs here)."""
        manifest = self._read()
        if manifest is None:
            return None
        path, rnd = self.directory / manifest["server"], manifest["round"]
        if "sha256" in manifest:
            verify(path, manifest["sha256"], rnd, self.manifest, self.directory)
        else:  # refused before, unless accepted (fedkit resume --accept-unverified)
            log.warning("%s records no digest of %s: not checked", self.manifest, path.name)
        for name in manifest.get("clients", []):
            folder = self.directory / "clients" / name
            if not folder.is_dir():
                raise FedkitError(
                    f"client checkpoint folder {folder} is gone (latest.json lists it for "
                    f"round {rnd}): that client's state cannot be restored, so the run cannot "
                    f"continue from round {rnd}; restart it from round 1 by deleting "
                    f"{self.directory} and running `fedkit resume {self.directory.parent}` again"
                )
        for folder in self._client_folders():
            folder.verify(rnd)
        return read_snapshot(path)

    def _client_folders(self) -> list[ClientCheckpoints]:
        """The client folders under this one (a simulation's nodes keep theirs here)."""
        found = sorted((self.directory / "clients").glob("*"))
        return [ClientCheckpoints(f) for f in found if f.is_dir()]

    def unverified(self) -> list[str]:
        """The checkpoint files of the last committed round that no digest covers (a run
        of this fedkit always records them: one missing is refused on resume unless
        accepted, see :meth:`accept`), as sentences naming them."""
        manifest = self._read()
        if manifest is None:
            return []
        missing = []
        if "sha256" not in manifest:
            missing.append(f"{self.directory / manifest['server']} (no sha256 in {self.manifest})")
        for folder in self._client_folders():
            if folder.holds_snapshots() and not (folder.folder / DIGESTS).is_file():
                missing.append(f"{folder.folder} (no {DIGESTS})")
        return missing

    def accept(self, missing: list[str]) -> None:
        """Accept the files ``missing`` digests (``fedkit resume --accept-unverified``, for
        a run of an older fedkit): noted here until the next round is committed, and read
        into the results by :meth:`accepted`."""
        note = {"round": self.round(), "unverified": missing}
        write_text(self.directory / ACCEPTED, json.dumps(note, indent=1))

    def accepted(self) -> list[dict[str, Any]]:
        """What :meth:`accept` noted (none: empty), for results.json."""
        try:
            note = json.loads((self.directory / ACCEPTED).read_text())
        except (OSError, ValueError):
            return []
        return [note] if isinstance(note, dict) else []

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
        if len(name) > MAX_NAME_BYTES:  # a long or non-Latin id: readable, cut, with a digest
            name = folder_name(client_id)
        return cls(Path(directory) / "clients" / re.sub(r"^\.", "%2E", name))

    def save(self, snapshot: dict[str, Any]) -> None:
        """Write the snapshot of its round, then its digest; keep only the newest two rounds."""
        name = f"r{snapshot['round']}.pt"
        write_snapshot(self.folder / name, snapshot)
        keep = {f"r{r}.pt" for r in sorted(self._rounds(), reverse=True)[:2]}
        digests = {k: v for k, v in (self._digests() or {}).items() if k in keep}
        digests[name] = file_digest(self.folder / name)
        write_text(self.folder / DIGESTS, json.dumps(digests, indent=1, sort_keys=True))
        _prune(self.folder, "r*.pt", keep=keep)

    def load(self, upto: int) -> dict[str, Any] | None:
        """The newest snapshot of a round <= ``upto`` (checked against its digest), or None."""
        rounds = [r for r in self._rounds() if r <= upto]
        if not rounds:
            return None
        self.verify(upto)
        return read_snapshot(self.folder / f"r{max(rounds)}.pt")

    def holds_snapshots(self) -> bool:
        return bool(self._rounds())

    def verify(self, upto: int) -> None:
        """Refuse the snapshot :meth:`load` would read when it does not match its digest,
        and a newer one of a round <= ``upto`` that the digests list but is gone (an older
        state would be resumed silently)."""
        digests = self._digests()
        listed = [int(m.group(1)) for m in map(_CLIENT_FILE.fullmatch, digests or {}) if m]
        newest = max((r for r in listed if r <= upto), default=None)
        if newest is not None and not (self.folder / f"r{newest}.pt").is_file():
            checkpoints = self.folder.parents[1]
            raise FedkitError(
                f"checkpoint file {self.folder / f'r{newest}.pt'} (round {newest}) is gone, "
                f"though {self.folder / DIGESTS} lists it: this client's state of round "
                f"{newest} cannot be restored, so the run cannot continue from round {upto}; "
                f"restart it from round 1 by deleting {checkpoints} and running "
                f"`fedkit resume {checkpoints.parent}` again"
            )
        rounds = [r for r in self._rounds() if r <= upto]
        if not rounds:
            return
        name = f"r{max(rounds)}.pt"
        if digests is None and not (self.folder / DIGESTS).exists():
            return  # written before digests existed
        record = self.folder / DIGESTS
        expected = (digests or {}).get(name)
        verify(self.folder / name, expected, max(rounds), record, self.folder.parents[1])

    def _digests(self) -> dict[str, str] | None:
        """``digests.json`` (None when absent or unreadable)."""
        try:
            digests = json.loads((self.folder / DIGESTS).read_text())
        except (OSError, ValueError):
            return None
        return digests if isinstance(digests, dict) else None

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
            _check_owner(snapshot, runtime.ctx.id, store)
            restore_client(runtime, snapshot)
        return snapshot
    if not runtime.dirty:
        return None
    snapshot = client_snapshot(runtime)
    if store is not None and not hides_sampling(runtime.ctx.config):
        store.save(snapshot)  # under secret DP sampling a stored snapshot says "I trained"
    return snapshot


def _check_owner(snapshot: dict[str, Any], client_id: str, store: ClientCheckpoints) -> None:
    """Refuse another client's snapshot (a folder copied over this client's: its digests
    match, and its state would be resumed silently as this client's)."""
    owner = snapshot.get("client_id", client_id)  # none: written before it was recorded
    if owner != client_id:
        checkpoints = store.folder.parents[1]
        raise FedkitError(
            f"checkpoint folder {store.folder} holds the state of client {str(owner)[:80]!r}, "
            f"not of {client_id!r} (copied over it?): the run cannot continue from it; put "
            f"back that client's own folder, or restart the run from round 1 by deleting "
            f"{checkpoints} and running `fedkit resume {checkpoints.parent}` again"
        )


def _prune(folder: Path, pattern: str, keep: set[str]) -> None:
    """Delete the files matching ``pattern`` not in ``keep``, and temporary files a killed
    writer left behind (writes to one folder never overlap)."""
    for path in [*folder.glob(pattern), *folder.glob(".*.tmp")]:
        if path.name not in keep:
            path.unlink(missing_ok=True)
