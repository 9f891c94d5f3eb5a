"""Deployment defaults (issue 18): the SuperLink serves this machine only unless told
otherwise, and authenticates SuperNodes whenever it runs with TLS."""

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
    assert main(["flower", "superlink", "--insecure"]) == 0
    (command,) = executed
    assert _value(command, "--host") == "127.0.0.1" and _value(command, "--port") == "9091"


def test_tls_superlinks_authenticate_supernodes_by_default(executed, certs):
    tls = ["--ca-cert", str(certs / "ca.crt"), "--cert", str(certs / "server.crt")]
    tls += ["--key", str(certs / "server.key")]
    assert main(["flower", "superlink", *tls]) == 0
    assert main(["flower", "superlink", *tls, "--no-node-auth"]) == 0
    assert "--enable-supernode-auth" in executed[0]
    assert "--enable-supernode-auth" not in executed[1]
    assert main(["flower", "superlink", "--insecure", "--node-auth"]) == 2  # Flower needs TLS


def test_a_supernode_authenticates_with_its_key(executed, certs):
    args = ["flower", "supernode", "--superlink", "h:1", "--partition-id", "0"]
    assert (
        main([*args, "--ca-cert", str(certs / "ca.crt"), "--auth-key", str(certs / "node0")]) == 0
    )
    assert _value(executed[0], "--auth-supernode-private-key") == str(certs / "node0")
    assert main([*args, "--insecure", "--auth-key", str(certs / "absent")]) == 2


def test_a_supernode_is_warm_unless_told_otherwise(executed):
    """Warm: Flower's SuperNode run by fedkit's wrapper (long-lived ClientApp executor,
    short polls); --no-warm: Flower's own executable, as before."""
    args = ["flower", "supernode", "--superlink", "h:1", "--partition-id", "0", "--insecure"]
    assert main(args) == 0 and main([*args, "--no-warm"]) == 0
    warm, plain = executed
    assert warm[1:3] == ["-m", "fedkit_core.engines.flower.warm"]
    assert warm[3:] == plain[1:] and plain[0].endswith("flower-supernode")
