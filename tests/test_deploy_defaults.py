"""Deployment defaults (issues 18 and 34): the SuperLink serves this machine only unless told
otherwise, its run submission and node registration this machine only in any case, and it
authenticates SuperNodes whenever it runs with TLS, with keys the operator may fix at start.
The SuperLink's two addresses are checked here request by request; the loopback deployment
in test_flower.py shows an outsider refused end to end."""

import pytest

from fedkit_core.cli import flower as flower_cli
from fedkit_core.cli import main

pytest.importorskip("flwr")


@pytest.fixture
def executed(monkeypatch):
    commands = []
    monkeypatch.setattr(flower_cli, "_exec", commands.append)
    return commands


@pytest.fixture
def certs(tmp_path):
    for name in ("ca.crt", "server.crt", "server.key", "node0"):
        (tmp_path / name).write_text("pem")
    return tmp_path


def _value(command, flag):
    return command[command.index(flag) + 1]


def test_the_superlink_binds_loopback_by_default(executed):
    """Both of its addresses: the SuperNodes' (Fleet API) and the operator's (run
    submission, node registration, the ServerApp), which stays on loopback by default."""
    assert main(["flower", "superlink", "--insecure"]) == 0
    assert main(["flower", "superlink", "--insecure", "--address", "10.0.0.5:7000"]) == 0
    local, internal = executed
    assert local[1:3] == ["-m", "fedkit_core.engines.flower.link"]
    assert _value(local, "--fleet") == "127.0.0.1:9091"
    assert _value(local, "--control") == "127.0.0.1:9092"
    assert _value(internal, "--fleet") == "10.0.0.5:7000"
    assert _value(internal, "--control") == "127.0.0.1:7001"
    assert main(["flower", "superlink", "--insecure", "--control-address", "127.0.0.1:9091"]) == 2


def test_tls_superlinks_authenticate_supernodes_by_default(executed, certs):
    tls = ["--ca-cert", str(certs / "ca.crt"), "--cert", str(certs / "server.crt")]
    tls += ["--key", str(certs / "server.key")]
    assert main(["flower", "superlink", *tls]) == 0
    assert main(["flower", "superlink", *tls, "--no-node-auth"]) == 0
    assert "--enable-supernode-auth" in executed[0]
    assert "--enable-supernode-auth" not in executed[1]
    assert main(["flower", "superlink", "--insecure", "--node-auth"]) == 2  # Flower needs TLS


def test_node_keys_are_fixed_at_start_and_need_node_authentication(executed, certs):
    tls = ["--ca-cert", str(certs / "ca.crt"), "--cert", str(certs / "server.crt")]
    tls += ["--key", str(certs / "server.key")]
    keys = certs / "nodes.pub"
    keys.write_text("ecdsa-sha2-nistp384 AAAA hospital-a\n")
    assert main(["flower", "superlink", *tls, "--node-keys", str(keys)]) == 0
    assert _value(executed[0], "--node-keys") == str(keys)
    assert "--enable-supernode-auth" in executed[0]
    assert main(["flower", "superlink", *tls, "--node-keys", str(keys), "--no-node-auth"]) == 2
    assert main(["flower", "superlink", *tls, "--node-keys", str(certs / "absent")]) == 2


def test_a_supernode_authenticates_with_its_key(executed, certs):
    args = ["flower", "supernode", "--superlink", "h:1", "--partition-id", "0"]
    assert (
        main([*args, "--ca-cert", str(certs / "ca.crt"), "--auth-key", str(certs / "node0")]) == 0
    )
    assert _value(executed[0], "--auth-supernode-private-key") == str(certs / "node0")
    assert main([*args, "--insecure", "--auth-key", str(certs / "absent")]) == 2


def test_a_supernode_is_flowers_own_unless_warm_is_asked_for(executed):
    """Default: Flower's own flower-supernode (the public path); --warm: Flower's SuperNode
    run by fedkit's wrapper (the fast layer: long-lived ClientApp executor, short polls)."""
    args = ["flower", "supernode", "--superlink", "h:1", "--partition-id", "0", "--insecure"]
    assert main(args) == 0 and main([*args, "--warm"]) == 0
    plain, warm = executed
    assert warm[1:3] == ["-m", "fedkit_core.engines.flower.warm"]
    assert warm[3:] == plain[1:] and plain[0].endswith("flower-supernode")


def test_a_warm_supernode_on_another_flower_is_flowers_own_with_a_warning(
    executed, monkeypatch, caplog
):
    from fedkit_core.engines.flower import fast

    monkeypatch.setattr(fast, "flower_version", lambda: "1.43.0")
    monkeypatch.setattr(fast, "_warned", False)
    args = ["flower", "supernode", "--superlink", "h:1", "--partition-id", "0", "--insecure"]
    with caplog.at_level("WARNING", logger="fedkit"):
        assert main([*args, "--warm"]) == 0
    assert executed[0][0].endswith("flower-supernode")
    assert len([r for r in caplog.records if "fast layer" in r.getMessage()]) == 1


def test_a_superlink_on_another_flower_is_flowers_own_on_the_operator_address_only(
    executed, monkeypatch, caplog, certs
):
    """fedkit's SuperLink (link.py) builds on Flower's internals, behind the fast layer's
    release check: on another release it is Flower's public flower-superlink, serving
    every API on one address, and that address is the operator's (fail closed)."""
    from fedkit_core.engines.flower import fast, link

    monkeypatch.setattr(fast, "flower_version", lambda: "1.43.0")
    with caplog.at_level("WARNING", logger="fedkit"):
        assert main(["flower", "superlink", "--insecure", "--address", "10.0.0.5:7000"]) == 0
    (command,) = executed
    assert command[0].endswith("flower-superlink")
    assert (_value(command, "--host"), _value(command, "--port")) == ("127.0.0.1", "7001")
    assert "10.0.0.5" not in " ".join(command) and "--insecure" in command
    assert "--disable-runtime-dependency-installation" in command
    assert [r for r in caplog.records if "flower-superlink" in r.getMessage()]
    (certs / "nodes.pub").write_text("ecdsa-sha2-nistp384 AAAA hospital-0\n")
    tls = ["--ca-cert", str(certs / "ca.crt"), "--cert", str(certs / "server.crt")]
    tls += ["--key", str(certs / "server.key")]
    assert main(["flower", "superlink", *tls, "--node-keys", str(certs / "nodes.pub")]) == 2
    with pytest.raises(SystemExit, match="written for Flower"):
        link.main(["--fleet", "127.0.0.1:7000", "--control", "127.0.0.1:7001"])


# ---------------------------------------------------------------------- the SuperLink's gate


def _asgi(middleware, path, port):
    """The status ``middleware`` (around an app that answers 200) gives a request for
    ``path`` arriving on local ``port``."""
    import asyncio

    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "server": ("127.0.0.1", port), "state": {}}
    asyncio.run(middleware(app)(scope, None, send))
    return sent[0]["status"]


def test_the_supernodes_address_serves_the_fleet_api_only():
    from fedkit_core.engines.flower.link import OperatorOnly

    def gate(app):
        return OperatorOnly(app, fleet_port=9091, fixed_keys=True)

    for path in ("/v1/fleet/activate-node", "/v1/fleet/pull-messages", "/health"):
        assert _asgi(gate, path, 9091) == 200, path
    for path in ("/v1/control/start-run", "/v1/control/register-node", "/v1/runtime/acquire-task"):
        assert _asgi(gate, path, 9091) == 403, path
        assert _asgi(gate, path, 9092) == (403 if "register" in path else 200), path
    assert _asgi(gate, "/v1/control/unregister-node", 9092) == 403  # keys fixed at start
    free = lambda app: OperatorOnly(app, fleet_port=9091, fixed_keys=False)  # noqa: E731
    assert _asgi(free, "/v1/control/register-node", 9092) == 200


def test_a_supernode_pushes_replies_in_its_own_name_only():
    import asyncio

    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.message_pb2 import Message as Proto

    from fedkit_core.engines.flower.link import OwnRepliesOnly

    def status(node, source):
        request = PushMessagesRequest()
        request.node.node_id = node
        reply = Proto()
        reply.metadata.src_node_id = source
        request.messages_list.append(reply)
        sent = []

        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/v1/fleet/push-messages"}
        scope["state"] = {"protobuf_request": request}
        asyncio.run(OwnRepliesOnly(app)(scope, None, send))
        return sent[0]["status"]

    assert status(7, 7) == 200 and status(7, 8) == 403


def test_node_keys_are_read_with_their_names_and_the_certificate_must_name_the_operator_host(
    tmp_path,
):
    import runpy

    from fedkit_core.engines.flower.link import check_certificate, read_keys
    from fedkit_core.testing import REPO_ROOT

    throwaway = runpy.run_path(str(REPO_ROOT / "examples" / "flower" / "throwaway_keys.py"))
    throwaway["main"](tmp_path, 2)
    listing = tmp_path / "nodes.pub"
    first = (tmp_path / "node0.pub").read_text().split()[:2]
    listing.write_text(f"# the hospitals\n{' '.join(first)} hospital-a\n\n")
    (name, key), (other, _) = read_keys([listing, tmp_path / "node1.pub"])
    assert name == "hospital-a" and other == "node1" and len(key) > 60
    with pytest.raises(SystemExit, match="listed twice"):
        read_keys([listing, tmp_path / "node0.pub"])
    (tmp_path / "rsa.pub").write_text("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7 x\n")
    with pytest.raises(SystemExit, match="rsa.pub line 1"):
        read_keys([tmp_path / "rsa.pub"])
    check_certificate(str(tmp_path / "server.crt"), "127.0.0.1")  # names 127.0.0.1, localhost
    with pytest.raises(SystemExit, match=r"does not name 10.0.0.9, .* add IP:10.0.0.9"):
        check_certificate(str(tmp_path / "server.crt"), "10.0.0.9")
