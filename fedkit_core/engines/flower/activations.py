"""Who activated which SuperNode key: the SuperLink's record, and what a run makes of it.

Flower admits one active SuperNode per registered key: whichever node presents the key
first is activated, a second one is refused ("Failed to activate SuperNode") while the
first stays. With a stolen hospital key, the thief who connects first serves as that
hospital and the hospital's own node is locked out, and Flower records nothing of it.

:class:`RecordActivations` (an ASGI middleware of ``fedkit flower superlink``, innermost,
so the request is parsed and its signature already verified by Flower's node
authentication) watches the Fleet API's ``/v1/fleet/activate-node`` calls
(``ActivateNodeRequest``: the node's public key): each activation of a fixed key is
appended to the SuperLink's node log with the node id, the key's name, the peer address
and the time; a refused activation of a key whose node is active (a second holder of the
key) is appended as ``refused`` and printed as a WARNING line on the SuperLink's console.

The log is a JSON-lines file, one per SuperLink start, in a folder the operator chooses
(``--node-log DIR``; default a fresh private folder under the system's temporary folder),
folder 0700 and file 0600, each record appended with one ``write`` to a file opened
``O_APPEND`` (a reader sees whole lines; a torn last line is skipped). The SuperLink puts
the file's path in its environment (:data:`NODE_LOG_ENV`), which its SuperExec and the
ServerApps it spawns inherit: the ServerApp of a run finds the log of exactly the
SuperLink that serves it, with no path to configure or guess (a file on the SuperLink's
machine, where the ServerApp runs, rather than a Flower channel: Flower offers none from
the SuperLink's Fleet side to a run). A ServerApp under another SuperLink (plain
``flower-superlink``), or started by a SuperExec the operator runs apart
(``--isolation process``, unless given the variable), finds none and says so
(:func:`node_record`) instead of inventing one.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedkit_core.results.schema import ACTIVATION as PHASE

if TYPE_CHECKING:
    from fedkit_core.engines.server import Server

#: the environment variable through which the ServerApp finds its SuperLink's node log
NODE_LOG_ENV = "FEDKIT_NODE_LOG"
#: Flower's Fleet API call that activates a SuperNode (flwr.superlink.routers.fleet.router)
ACTIVATE = "/v1/fleet/activate-node"
#: what a run's node record says when no SuperLink record reaches its ServerApp
UNAVAILABLE = (
    "no node record: the SuperLink logs activations only as `fedkit flower superlink "
    "--node-keys`, so the nodes' keys and addresses are unknown; only Flower's node ids are"
)


def open_node_log(folder: Path | None) -> Path:
    """A new log file for one SuperLink start in ``folder`` (created 0700; default: a fresh
    private folder under the system's temporary folder); the file is created 0600."""
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="fedkit-superlink-"))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = folder / f"nodes-{stamp}-{os.getpid()}.jsonl"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


def _append(path: Path, record: Mapping[str, Any]) -> None:
    line = (json.dumps(dict(record), sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)  # one write of a short line on an O_APPEND file: whole or absent
    finally:
        os.close(fd)


def refusal_warning(record: Mapping[str, Any]) -> str:
    """The operator's warning about a refused second activation ``record``."""
    held = record.get("active_address") or "an unknown address"
    return (
        f"WARNING: a second SuperNode presented the key {record['key']} (node "
        f"{record['node_id']}) from {record['address']} while it is active from {held}; "
        "Flower refused it. One of the two holds a copy of that key: if the active node is "
        f"not {record['key']}'s own, restart the SuperLink without that key in --node-keys "
        "and issue the site a new one (docs/engines.md, 'Who can do what')"
    )


class RecordActivations:
    """ASGI middleware: the node log's record of every activation of a fixed key (see the
    module docstring). ``names``: public key bytes -> the key's name; ``state``: the
    SuperLink's LinkState (for the node id of a key)."""

    def __init__(self, app: Any, log: Path, names: Mapping[bytes, str], state: Any) -> None:
        self.app = app
        self.log = log
        self.names = dict(names)
        self.state = state
        self.active: dict[int, str] = {}  # node id -> the address it was last activated from

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != ACTIVATE:
            return await self.app(scope, receive, send)
        from flwr.supercore.error import ApiErrorCode, FlowerError

        request = (scope.get("state") or {}).get("protobuf_request")
        key = getattr(request, "public_key", None)
        try:
            await self.app(scope, receive, send)
        except FlowerError as err:  # answered by Flower's error translator, further out
            if err.code == ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED and key in self.names:
                self._record(scope, key, refused=True)
            raise
        if key in self.names:  # not a key the operator fixed: Flower refuses it, no event
            self._record(scope, key, refused=False)

    def _record(self, scope: dict[str, Any], key: bytes, refused: bool) -> None:
        """Append the activation (or, ``refused``, the second one) of ``key`` to the log."""
        node_id = self.state.get_node_id_by_public_key(key)
        host, port = scope.get("client") or ("unknown", 0)
        record: dict[str, Any] = {
            "kind": "refused" if refused else "activated",
            "node_id": node_id,
            "key": self.names[key],
            "address": f"{host}:{port}",
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        if refused:  # Flower refuses a fixed key's activation only while its node is active
            record["active_address"] = self.active.get(node_id)
            print(refusal_warning(record), flush=True)
        else:
            self.active[node_id] = record["address"]
            print(
                f"SuperLink: node {node_id} ({record['key']}) active from {record['address']}",
                flush=True,
            )
        _append(self.log, record)


def read_node_log(path: Path) -> list[dict[str, Any]]:
    """The records of a node log (a torn or foreign line is skipped)."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") in ("activated", "refused"):
            records.append(record)
    return records


def node_record(
    clients: Mapping[str, int], deployed: bool, log: Path | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Who served each client (``clients``: client id -> Flower node id) for results.json's
    ``nodes`` (``source``: ``superlink``, ``simulation`` or ``unavailable``; per client its
    ``node_id`` and, from the log, the ``key``'s name, the peer ``address`` and the ``time``
    of its node's last activation), and the refused second activations in ``log`` as events (``phase``
    :data:`PHASE`, the client whose key it was, the warning as ``error``, and the refused
    node's ``key`` name, ``node_id``, ``address``, the ``active_address`` and ``time``; no
    round).

    In a simulation the nodes are Flower's simulated ones; deployed without a log (no
    ``fedkit flower superlink``), only the node ids are known and ``source`` says so."""
    ids = {cid: {"node_id": node} for cid, node in clients.items()}
    if not deployed:
        return {"source": "simulation", "clients": ids}, []
    if log is None or not log.is_file():
        return {"source": "unavailable", "about": UNAVAILABLE, "clients": ids}, []
    records = read_node_log(log)
    latest = {r["node_id"]: r for r in records if r["kind"] == "activated"}
    served = {
        cid: {
            "node_id": node,
            **{k: latest[node][k] for k in ("key", "address", "time") if node in latest},
        }
        for cid, node in clients.items()
    }
    client_of = {node: cid for cid, node in clients.items()}
    events = [
        {
            "phase": PHASE,
            "client": client_of.get(r["node_id"]),
            "error": refusal_warning(r).removeprefix("WARNING: "),
            **{k: r.get(k) for k in ("key", "node_id", "address", "active_address", "time")},
        }
        for r in records
        if r["kind"] == "refused"
    ]
    return {"source": "superlink", "log": str(log), "clients": served}, events


def environment_log() -> Path | None:
    """The node log of the SuperLink this process runs under (:data:`NODE_LOG_ENV`)."""
    path = os.environ.get(NODE_LOG_ENV)
    return Path(path) if path else None


class NodeWatch:
    """Keeps a run's ``nodes`` and activation events current (``drive``'s
    ``before_write``): every refused second activation the SuperLink has logged since it
    started, before or during the run, becomes an event once, with the last round done
    when it was first seen (0: before the first), and a warning in the ServerApp's log
    (``flwr log RUN_ID``)."""

    def __init__(self, clients: Mapping[str, int], deployed: bool, log: Path | None) -> None:
        self.clients = dict(clients)
        self.deployed = deployed
        self.log = log

    def __call__(self, server: Server) -> None:
        server.nodes, events = node_record(self.clients, self.deployed, self.log)
        rnd = server.records[-1]["round"] if server.records else 0
        known = {e["error"] for e in server.events if e.get("phase") == PHASE}
        for event in events:
            if event["error"] not in known:
                server.events.append({"round": rnd, **event})
                logging.getLogger("flwr").warning("fedkit: %s", event["error"])
