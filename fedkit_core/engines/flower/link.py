"""The SuperLink of a deployment (``fedkit flower superlink``): Flower's own, served on two
addresses so that the hospitals' network reaches only what SuperNodes need.

Flower 1.41 serves every API of its SuperLink on one HTTP port: the Fleet API (SuperNodes
join, pull messages, push replies), the Control API (``flwr run``, ``flwr supernode
register``/``unregister``, ``flwr list``/``log``/``stop``; no authentication of its caller
in Flower's open-source release) and the Runtime API (the ServerApp's and its SuperExec's,
which hands out the run's tasks to whoever asks first). Anyone who reached that port could
register a SuperNode key of their own and join, unregister a hospital's node, or submit a
run: code that runs on the server and on every SuperNode. This module runs Flower's
SuperLink application (``flwr.superlink.main.create_app``) in one uvicorn server with two
listeners:

* the **Fleet address** (``--address``, the one the hospitals reach) serves the Fleet API
  and the health check only; any other request is answered 403;
* the **operator address** (``--control-address``, default ``127.0.0.1``, the next port)
  serves the Control and Runtime APIs: run submission and node registration from the
  SuperLink's machine only (or an address the operator chooses), and Flower's own
  SuperExec and ServerApp, which run there.

With ``--node-keys FILE`` the SuperNodes' public keys are fixed at start: registered in the
SuperLink's state before it serves (Flower 1.41 removed its ``--auth-list-public-keys``),
named by each key's comment, and the Control API's ``register-node`` and
``unregister-node`` are refused on both addresses, so the set of nodes cannot change while
the SuperLink runs. Each activation of a fixed key is logged (node id, key name, peer
address, time) and a second activation of an active key is a warning on the console and
an event of the run (:mod:`.activations`; ``--node-log DIR`` chooses where the log goes).
docs/engines.md ("Who can do what") says what each party can and cannot do with this in
place.

Flower has no public API for any of this (its ``flower-superlink`` serves one address and
takes no middleware), so this module builds the SuperLink from Flower's modules
(``_parse_superlink_lifespan_config``, ``create_app``, the app's ``linkstate_factory``)
and runs only on the Flower releases the fast layer is written for (:func:`.fast.supported`):
on any other, ``fedkit flower superlink`` runs Flower's own ``flower-superlink`` instead
(:func:`.deploy.public_superlink`).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: what the Fleet address serves: the Fleet API and the health check
FLEET_PATHS = ("/v1/fleet/", "/health")
#: the Control API's calls that change which SuperNodes may join
NODE_REGISTRATION = ("/v1/control/register-node", "/v1/control/unregister-node")
#: the name the operator's fixed keys are owned by in ``flwr supernode list``
OPERATOR = "operator (--node-keys)"


class OperatorOnly:
    """ASGI middleware: requests that reach the Fleet port get only :data:`FLEET_PATHS`;
    with ``fixed_keys``, node registration is refused on every port."""

    def __init__(self, app: Any, fleet_port: int, fixed_keys: bool) -> None:
        self.app = app
        self.fleet_port = fleet_port
        self.fixed_keys = fixed_keys

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            port = (scope.get("server") or (None, None))[1]  # the socket's: not spoofable
            if port == self.fleet_port and not path.startswith(FLEET_PATHS):
                return await _refuse(
                    send,
                    f"{path} is not served on the SuperNodes' address: the Control and "
                    "Runtime APIs answer on the operator's address only",
                )
            if self.fixed_keys and path in NODE_REGISTRATION:
                return await _refuse(
                    send,
                    "the SuperNodes' keys are fixed by the operator at start (--node-keys): "
                    "restart the SuperLink with another key list to change them",
                )
        await self.app(scope, receive, send)


class OwnRepliesOnly:
    """Starlette middleware (innermost, after Flower's node authentication): a SuperNode
    pushes replies in its own name only. Flower 1.41 takes a pushed reply's source node
    from the message itself, not from the key that signed the request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") == "/v1/fleet/push-messages":
            request = (scope.get("state") or {}).get("protobuf_request")
            node = getattr(getattr(request, "node", None), "node_id", None)
            sources = {m.metadata.src_node_id for m in getattr(request, "messages_list", [])}
            if request is None or sources - {node}:
                return await _refuse(send, "a SuperNode may push replies in its own name only")
        await self.app(scope, receive, send)


async def _refuse(send: Any, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def read_keys(paths: Sequence[Path]) -> list[tuple[str, bytes]]:
    """``(name, public key bytes as Flower stores them)`` of every OpenSSH public key in
    ``paths`` (one or more a file, one a line; ``#`` comments and blank lines skipped);
    a key's name is its comment, else its file's stem. The keys must be NIST EC keys, as
    Flower's node authentication needs."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes, uses_nist_ec_curve

    keys = []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise SystemExit(f"error: cannot read the node keys {path}: {err}") from None
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                key = serialization.load_ssh_public_key(line.encode())
            except (ValueError, TypeError) as err:
                raise SystemExit(f"error: {path} line {number} is no public key: {err}") from None
            if not isinstance(key, ec.EllipticCurvePublicKey) or not uses_nist_ec_curve(key):
                raise SystemExit(
                    f"error: {path} line {number}: SuperNode keys must be NIST EC keys "
                    "(ssh-keygen -t ecdsa -b 384)"
                )
            parts = line.split(None, 2)
            name = parts[2] if len(parts) > 2 else Path(path).stem
            keys.append((name, public_key_to_bytes(key)))
    if len({k for _, k in keys}) != len(keys):
        raise SystemExit("error: a SuperNode key is listed twice in --node-keys")
    return keys


def check_certificate(certfile: str, host: str) -> None:
    """Exit with a clear error when the SuperLink's certificate does not name ``host``,
    the operator address, where the SuperExec, ServerApps and ``flwr`` connect with TLS."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound) as err:
        raise SystemExit(
            f"error: cannot read the names of the certificate {certfile}: {err}"
        ) from None
    try:
        ip = ipaddress.ip_address(host)
        covered = ip in names.get_values_for_type(x509.IPAddress)
    except ValueError:
        covered = host in names.get_values_for_type(x509.DNSName)
    if not covered:
        kind = "IP" if _is_ip(host) else "DNS"
        raise SystemExit(
            f"error: the SuperLink's certificate {certfile} does not name {host}, the "
            f"operator address (run submission, the ServerApp): add {kind}:{host} to its "
            "subjectAltName (docs/engines.md, step 1)"
        )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        raise SystemExit(f"error: cannot listen on {host}:{port}: {err.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"error: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def main(argv: Sequence[str]) -> None:
    """``link --fleet HOST:PORT --control HOST:PORT [--node-keys FILE]... [--node-log DIR]
    -- FLOWER_ARGS``: Flower's SuperLink with ``FLOWER_ARGS`` (``flower-superlink``'s,
    without ``--host`` and ``--port``), served as the module docstring says."""
    parser = argparse.ArgumentParser(prog="fedkit flower superlink")
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--node-keys", type=Path, action="append", default=[])
    parser.add_argument("--node-log", type=Path, default=None)
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    ours, flower_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    fleet, control = _address(ours.fleet), _address(ours.control)
    if fleet[1] == control[1]:
        raise SystemExit("error: the Fleet and the operator address need ports of their own")
    from fedkit_core.engines.flower.fast import WRITTEN_FOR, flower_version, supported

    if not supported(flower_version()):
        raise SystemExit(
            f"error: this SuperLink is written for Flower {' and '.join(WRITTEN_FOR)}, found "
            f"flwr {flower_version()}: start it with `fedkit flower superlink`, which runs "
            "Flower's own flower-superlink on this release"
        )
    keys = read_keys(ours.node_keys)
    if keys and "--enable-supernode-auth" not in flower_args:
        raise SystemExit("error: --node-keys needs SuperNode authentication (TLS)")
    if "--ssl-certfile" in flower_args:
        check_certificate(flower_args[flower_args.index("--ssl-certfile") + 1], control[0])

    import uvicorn
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, NOOP_FLWR_AID
    from flwr.supercore.http_logging import get_uvicorn_log_config
    from flwr.supercore.logger import console_handler
    from flwr.superlink.cli.flower_superlink import (
        SuperLinkLifespan,
        _parse_superlink_lifespan_config,
    )
    from flwr.superlink.main import create_app
    from starlette.middleware import Middleware

    from fedkit_core.engines.flower.activations import (
        NODE_LOG_ENV,
        RecordActivations,
        open_node_log,
    )

    host, port = control
    sys.argv = ["flower-superlink", "--host", host, "--port", str(port), *flower_args]
    config = _parse_superlink_lifespan_config()  # Flower's own checks of its arguments
    app = create_app(config, SuperLinkLifespan)
    app.add_middleware(OperatorOnly, fleet_port=fleet[1], fixed_keys=bool(keys))  # outermost
    app.user_middleware.append(Middleware(OwnRepliesOnly))  # innermost: the request is parsed
    state = app.state.linkstate_factory.state()
    node_log = None
    if keys:  # the activations of the fixed keys; the SuperExec and ServerApps inherit the path
        node_log = open_node_log(ours.node_log)
        os.environ[NODE_LOG_ENV] = str(node_log)
        names = {key: name for name, key in keys}
        app.user_middleware.append(
            Middleware(RecordActivations, log=node_log, names=names, state=state)
        )
    for name, key in keys:  # before the SuperLink serves anyone
        state.create_node(NOOP_FLWR_AID, OPERATOR, key, HEARTBEAT_DEFAULT_INTERVAL, name=name)
    sockets = [_listener(*fleet), _listener(*control)]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            access_log=True,
            log_config=get_uvicorn_log_config(console_handler.level),
            ssl_keyfile=config.ssl_keyfile,
            ssl_certfile=config.ssl_certfile,
        )
    )
    print(
        f"SuperLink: SuperNodes (Fleet API) on {ours.fleet}; run submission, node "
        f"registration and ServerApps (Control and Runtime APIs) on {ours.control}"
        + (f"; {len(keys)} SuperNode keys fixed, activations logged to {node_log}" if keys else ""),
        flush=True,
    )
    server.run(sockets=sockets)


if __name__ == "__main__":
    main(sys.argv[1:])
