"""The SuperLink's record of SuperNode activations (issue 44, a stolen hospital key): every
activation of a fixed key is logged with its node id, key name and peer address, a second
activation of an active key is a warning on the SuperLink's console and an event of the
run, and results.json names who served each client. The middleware is driven request by
request here; the loopback deployment in test_flower.py plays the thief end to end."""

from __future__ import annotations

import asyncio
import stat

import pytest

pytest.importorskip("flwr")

from flwr.supercore.error import ApiErrorCode, FlowerError  # noqa: E402

from fedkit_core.cli.options import finish  # noqa: E402
from fedkit_core.engines.flower.activations import (  # noqa: E402
    ACTIVATE,
    UNAVAILABLE,
    NodeWatch,
    RecordActivations,
    node_record,
    open_node_log,
    read_node_log,
)

HOSPITAL, OUTSIDER = b"hospital-0's key", b"an outsider's key"


class _State:
    """The LinkState's one call the middleware makes."""

    def get_node_id_by_public_key(self, key: bytes) -> int | None:
        return 7 if key == HOSPITAL else None


def _activate(recorder: RecordActivations, key: bytes, peer: tuple[str, int]) -> None:
    """One activate-node request from ``peer``, answered as Flower answers it: activated
    while the key's node is not active, else FLEET_NODE_ACTIVATION_FAILED."""

    class Request:
        public_key = key

    scope = {
        "type": "http",
        "path": ACTIVATE,
        "client": peer,
        "state": {"protobuf_request": Request()},
    }
    asyncio.run(recorder(scope, None, None))


def _recorder(tmp_path):
    active: set[bytes] = set()

    async def flower(scope, receive, send):
        key = scope["state"]["protobuf_request"].public_key
        if key != HOSPITAL or key in active:
            raise FlowerError(ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED, "not activated")
        active.add(key)

    log = open_node_log(tmp_path / "node-log")
    return RecordActivations(flower, log, {HOSPITAL: "hospital-0"}, _State()), log


def test_a_second_activation_of_an_active_key_is_logged_and_warned(tmp_path, capsys):
    recorder, log = _recorder(tmp_path)
    _activate(recorder, HOSPITAL, ("10.0.0.9", 4000))  # the first holder of the key
    with pytest.raises(FlowerError):  # Flower's refusal still reaches the node
        _activate(recorder, HOSPITAL, ("10.0.0.5", 5000))  # the second
    with pytest.raises(FlowerError):  # a key the operator did not fix: no hospital's
        _activate(recorder, OUTSIDER, ("10.0.0.6", 6000))
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "SuperLink: node 7 (hospital-0) active from 10.0.0.9:4000"
    assert said[1].startswith(
        "WARNING: a second SuperNode presented the key hospital-0 (node 7) from "
        "10.0.0.5:5000 while it is active from 10.0.0.9:4000; Flower refused it."
    )
    assert len(said) == 2
    records = read_node_log(log)
    assert [(r["kind"], r["node_id"], r["key"], r["address"]) for r in records] == [
        ("activated", 7, "hospital-0", "10.0.0.9:4000"),
        ("refused", 7, "hospital-0", "10.0.0.5:5000"),
    ]
    assert records[1]["active_address"] == "10.0.0.9:4000"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700


def test_the_default_node_log_is_a_fresh_private_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    first, second = open_node_log(None), open_node_log(None)
    assert first.parent != second.parent and first.parent.parent == tmp_path
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700


def test_the_run_names_who_served_each_client_and_records_refusals_once(tmp_path, caplog):
    recorder, log = _recorder(tmp_path)
    _activate(recorder, HOSPITAL, ("10.0.0.9", 4000))
    with log.open("a") as torn:  # a line cut short is skipped, not fatal
        torn.write('{"kind": "refu')
    clients = {"site0": 7, "site1": 8}

    class Server:
        records: list = []
        events: list = []
        nodes = None

    watch = NodeWatch(clients, True, log)
    watch(Server)
    assert Server.nodes["source"] == "superlink" and Server.events == []
    assert Server.nodes["clients"]["site0"]["key"] == "hospital-0"
    assert Server.nodes["clients"]["site0"]["address"] == "10.0.0.9:4000"
    assert Server.nodes["clients"]["site1"] == {"node_id": 8}  # not in the log
    with log.open("a") as out:
        out.write("\n")
    with pytest.raises(FlowerError):
        _activate(recorder, HOSPITAL, ("10.0.0.5", 5000))
    Server.records = [{"round": 1}]
    watch(Server)
    watch(Server)  # seen once, recorded once
    (event,) = Server.events
    assert event["round"] == 1 and event["phase"] == "activation"
    assert event["client"] == "site0" and event["key"] == "hospital-0"
    assert (event["address"], event["active_address"]) == ("10.0.0.5:5000", "10.0.0.9:4000")
    assert "a second SuperNode presented the key hospital-0" in caplog.text


def test_without_the_superlinks_log_the_record_says_so(tmp_path):
    clients = {"site0": 3}
    simulated, no_events = node_record(clients, False, None)
    assert simulated == {"source": "simulation", "clients": {"site0": {"node_id": 3}}}
    assert no_events == []
    unavailable, no_events = node_record(clients, True, tmp_path / "absent.jsonl")
    assert unavailable == {
        "source": "unavailable",
        "about": UNAVAILABLE,
        "clients": {"site0": {"node_id": 3}},
    }
    assert no_events == []


def test_a_quiet_submission_still_shows_the_activation_warning(tmp_path, capsys):
    event = {"round": 0, "phase": "activation", "client": "site0", "error": "a second one"}
    failure = {"round": 1, "phase": "fit", "client": "site1", "error": "boom"}
    finish({"events": [event, failure]}, tmp_path, quiet=True)
    said = capsys.readouterr()
    assert said.out.strip() == str(tmp_path)
    assert said.err.strip() == "warning: a second one"
