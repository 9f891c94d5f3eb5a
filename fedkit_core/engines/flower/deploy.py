"""Deployment on Flower: the commands that start a SuperLink and SuperNodes, the Flower App
of a run, and submitting it to a SuperLink.

A run is submitted as a small generated Flower App (a ``pyproject.toml`` naming fedkit's
ServerApp/ClientApp, with the resolved fedkit config and the output folder in its run
config) through the ``flwr`` command line, which is Flower's public interface for it; the
submitter then follows the run (``flwr log --stream``, then ``flwr list`` for its status)
until it has finished. Nothing here imports ``flwr``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fedkit_core.config import Config
from fedkit_core.engines.flower.node import CONFIG_KEY, DATA_PATH_KEY, OUT_KEY, PARTITION_KEY
from fedkit_core.errors import FedkitError

log = logging.getLogger("fedkit")

CONNECTION = "fedkit"  # the SuperLink connection's name in the generated Flower config


@dataclass
class Tls:
    """TLS settings of one party: ``insecure`` (test only) or certificate paths."""

    insecure: bool = False
    ca_cert: Path | None = None  # the CA that signed the SuperLink's certificate
    cert: Path | None = None  # the SuperLink's certificate and key (SuperLink only)
    key: Path | None = None

    def check(self, server: bool) -> None:
        if self.insecure:
            return
        needed = {"--ca-cert": self.ca_cert}
        if server:
            needed |= {"--cert": self.cert, "--key": self.key}
        missing = [flag for flag, path in needed.items() if path is None]
        if missing:
            raise FedkitError(
                f"TLS needs {', '.join(missing)} (see docs/engines.md); use --insecure only "
                "for a test on one machine"
            )
        for path in needed.values():
            if not Path(path).is_file():
                raise FedkitError(f"certificate file not found: {path}")


def flower_command(name: str) -> str:
    """A Flower executable, preferring the one installed beside this Python."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise FedkitError(f"{name} not found: pip install 'fedkit[flower]'")
    return found


def superlink_command(
    address: str,
    tls: Tls,
    node_auth: bool | None = None,
    control_address: str | None = None,
    node_keys: Sequence[Path] = (),
    node_log: Path | None = None,
) -> list[str]:
    """Flower's SuperLink, run by :mod:`.link`: the Fleet API (SuperNodes) on ``address``,
    the Control and Runtime APIs (run submission, node registration, the ServerApp) on
    ``control_address`` only (default: ``127.0.0.1``, the next port).

    :mod:`.link` builds Flower's SuperLink application from Flower's modules, so it runs
    only on the Flower releases the fast layer is written for (:mod:`.fast`). On another
    release this is Flower's own ``flower-superlink`` (its public command, serving every API
    on one address) on ``control_address``, where nothing reaches it but what the operator
    chose, with a warning: the SuperNodes then need that address (``--control-address``),
    and ``node_keys`` are refused (register nodes with ``flwr supernode register``).

    Runtime dependency installation stays off: the ServerApp must import the fedkit and
    plugins installed beside Flower, not a fresh environment. ``node_auth`` (default: on
    with TLS; Flower allows it only with TLS): only SuperNodes whose public keys are
    registered may join; ``node_keys``: files of the keys, fixed at start (no other node
    can then be registered or a node unregistered while the SuperLink runs); ``node_log``:
    the folder of the log of their activations (default: a fresh private temporary one).
    """
    tls.check(server=True)
    if node_auth is None:
        node_auth = not tls.insecure
    if node_auth and tls.insecure:
        raise FedkitError("SuperNode authentication needs TLS: drop --insecure or --node-auth")
    if node_keys and not node_auth:
        raise FedkitError(
            "--node-keys needs SuperNode authentication (TLS, without --no-node-auth)"
        )
    for path in node_keys:
        if not Path(path).is_file():
            raise FedkitError(f"node key file not found: {path}")
    host, port = split_address(address)
    if control_address is None:
        control_address = f"127.0.0.1:{port + 1}"
    if split_address(control_address)[1] == port:
        raise FedkitError("--control-address needs a port other than --address's")
    if node_log is not None and not node_keys:
        raise FedkitError("--node-log logs the activations of --node-keys: give those")
    if link_supported():
        command = [sys.executable, "-m", "fedkit_core.engines.flower.link", "--fleet", address]
        command += ["--control", control_address]
        for path in node_keys:
            command += ["--node-keys", str(Path(path).resolve())]
        if node_log is not None:
            command += ["--node-log", str(Path(node_log).resolve())]
        command.append("--")
    else:
        command = public_superlink(address, control_address, bool(node_keys))
    command.append("--disable-runtime-dependency-installation")
    if tls.insecure:
        return [*command, "--insecure"]
    if node_auth:
        command.append("--enable-supernode-auth")
    return [
        *command,
        *("--ssl-ca-certfile", str(tls.ca_cert)),
        *("--ssl-certfile", str(tls.cert)),
        *("--ssl-keyfile", str(tls.key)),
    ]


def link_supported() -> bool:
    """Whether :mod:`.link` (two addresses, fixed node keys) runs on the installed Flower:
    the fast layer's release check (:func:`.fast.supported`)."""
    from fedkit_core.engines.flower.fast import flower_version, supported

    return supported(flower_version())


def public_superlink(address: str, control_address: str, node_keys: bool) -> list[str]:
    """Flower's own ``flower-superlink`` on ``control_address`` (every API on one address),
    for a Flower release :mod:`.link` is not written for; a warning says what changes."""
    from fedkit_core.engines.flower.fast import WRITTEN_FOR, flower_version

    found = flower_version()
    if node_keys:
        raise FedkitError(
            f"--node-keys needs fedkit's SuperLink, written for Flower {' and '.join(WRITTEN_FOR)}"
            f" (found flwr {found}): drop --node-keys and register the SuperNodes with `flwr "
            "supernode register` on the operator address, or install a Flower release it is "
            "written for"
        )
    host, port = split_address(control_address)
    log.warning(
        "fedkit's SuperLink (two addresses, fixed node keys) is written for Flower %s, found "
        "flwr %s: running Flower's own flower-superlink, which serves the Fleet, Control and "
        "Runtime APIs on one address, on the operator address %s only (not %s): SuperNodes "
        "connect there, so give --control-address an address they reach only if they may "
        "also submit runs and register nodes (docs/engines.md)",
        " and ".join(WRITTEN_FOR),
        found,
        control_address,
        address,
    )
    return [flower_command("flower-superlink"), "--host", host, "--port", str(port)]


def supernode_command(
    superlink: str,
    partition: int,
    data_path: str | None,
    port: int,
    tls: Tls,
    auth_key: Path | None = None,
) -> list[str]:
    """``flower-supernode`` serving client ``partition`` (from its own data, if given),
    authenticating with the private key ``auth_key`` when the SuperLink requires it."""
    tls.check(server=False)
    if auth_key is not None and not Path(auth_key).is_file():
        raise FedkitError(f"SuperNode key not found: {auth_key}")
    node_config = f"{PARTITION_KEY}={partition}"
    if data_path:
        node_config += f" {DATA_PATH_KEY}={json.dumps(str(Path(data_path).resolve()))}"
    command = [flower_command("flower-supernode"), "--superlink", superlink]
    command += ["--port", str(port), "--node-config", node_config]
    if auth_key is not None:
        command += ["--auth-supernode-private-key", str(auth_key)]
    if tls.insecure:
        return [*command, "--insecure"]
    return [*command, "--root-certificates", str(tls.ca_cert)]


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise FedkitError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def write_app(directory: Path, cfg: Config, out: Path | None) -> Path:
    """A Flower App for ``cfg``: fedkit's components, the config and output in its run config."""
    directory.mkdir(parents=True, exist_ok=True)
    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": "fedkit-run",
            "version": "1.0.0",
            "description": "a fedkit run (generated by fedkit flower submit)",
            "license": "Apache-2.0",
            "dependencies": [],  # fedkit and the plugins are installed on every machine
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "fedkit",
                    "components": {
                        "serverapp": "fedkit_core.engines.flower.app:server_app",
                        "clientapp": "fedkit_core.engines.flower.app:client_app",
                    },
                    "config": {
                        CONFIG_KEY: json.dumps(cfg.nested(), sort_keys=True),
                        OUT_KEY: str(Path(out).resolve()) if out else "",
                    },
                }
            }
        },
    }
    (directory / "pyproject.toml").write_text(tomli_w.dumps(project))
    return directory


def write_connection(home: Path, superlink: str, tls: Tls) -> Path:
    """A Flower configuration (``$FLWR_HOME/config.toml``) with one SuperLink connection."""
    tls.check(server=False)
    connection: dict[str, object] = {"address": superlink}
    if tls.insecure:
        connection["insecure"] = True
    else:
        connection["root-certificates"] = str(Path(tls.ca_cert).resolve())  # type: ignore[arg-type]
    home.mkdir(parents=True, exist_ok=True)
    text = tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: connection}})
    (home / "config.toml").write_text(text)
    return home


def submit(
    cfg: Config,
    out: Path | None,
    superlink: str,
    tls: Tls,
    *,
    wait: bool = True,
    poll: float = 2.0,
    echo: Callable[[str], None] = print,
) -> str:
    """Submit ``cfg`` to the SuperLink at ``superlink``; wait for it (unless ``wait`` is
    false) and return the Flower run id. A run that does not complete raises, with its log."""
    if cfg["flower.nodes"] is None:
        raise FedkitError("set flower.nodes (--nodes) to the number of SuperNodes, one per client")
    with tempfile.TemporaryDirectory(prefix="fedkit-flower-") as tmp:
        app = write_app(Path(tmp) / "app", cfg, out)
        env = {**os.environ, "FLWR_HOME": str(write_connection(Path(tmp) / "home", superlink, tls))}
        env["PATH"] = os.pathsep.join(
            [str(Path(flower_command("flwr")).parent), env.get("PATH", "")]
        )
        started = _flwr(["run", str(app), CONNECTION, "--format", "json"], env)
        if not started.get("success"):
            raise FedkitError(f"the SuperLink refused the run: {started.get('error-message')}")
        run_id = str(started["run-id"])
        echo(f"submitted run {run_id} to {superlink}")
        if not wait:
            return run_id
        try:
            status, details = _wait(run_id, env, poll)
        except KeyboardInterrupt:  # do not leave the run training on the sites
            _flwr(["stop", run_id, CONNECTION, "--format", "json"], env, attempts=1)
            echo(f"stopped run {run_id}")
            raise
        if status != "finished:completed":
            log = subprocess.run(
                [flower_command("flwr"), "log", run_id, CONNECTION, "--show"],
                env=env,
                capture_output=True,
                text=True,
            ).stdout
            tail = "\n".join(log.strip().splitlines()[-30:])
            raise FedkitError(f"Flower run {run_id} ended {status} ({details}); its log:\n{tail}")
    echo(f"run {run_id} completed")
    return run_id


def _wait(run_id: str, env: dict[str, str], poll: float) -> tuple[str, str]:
    """The final status of run ``run_id``; an error if the SuperLink stops knowing it.

    One ``flwr log --stream`` process follows the run until Flower ends the stream (the run
    finished, or the connection dropped: then the status says which), rather than a ``flwr
    list`` process every ``poll`` seconds: each costs about 2 s of CPU (Python and Flower
    imports) taken from the run when it shares the machine."""
    while True:
        follow = subprocess.Popen(
            [flower_command("flwr"), "log", run_id, CONNECTION, "--stream"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            follow.wait()
        finally:
            if follow.poll() is None:  # interrupted: stop following
                follow.terminate()
                follow.wait()
        listing = _flwr(["list", CONNECTION, "--run-id", run_id, "--format", "json"], env)
        if not listing.get("success"):
            raise FedkitError(
                f"cannot follow run {run_id} on the SuperLink (was it restarted?): "
                f"{listing.get('error-message')}"
            )
        runs = listing.get("runs") or []
        if runs and str(runs[0].get("status", "")).startswith("finished"):
            return str(runs[0]["status"]), str(runs[0].get("status-details", ""))
        time.sleep(poll)


def _flwr(args: list[str], env: dict[str, str], attempts: int = 5) -> dict:
    """Run a ``flwr`` command with JSON output; retry while the SuperLink is unreachable."""
    for attempt in range(attempts):
        done = subprocess.run(
            [flower_command("flwr"), *args], env=env, capture_output=True, text=True
        )
        try:
            data = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise FedkitError(
                f"flwr {args[0]} failed: {(done.stderr or done.stdout).strip()[-2000:]}"
            ) from None
        unreachable = "unavailable" in str(data.get("error-message", ""))
        if data.get("success") or not unreachable or attempt == attempts - 1:
            return data
        time.sleep(2.0 * (attempt + 1))
    raise AssertionError("unreachable")
