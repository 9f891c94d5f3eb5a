"""``fedkit flower ...``: start a SuperLink or a SuperNode, submit a run to a SuperLink.

``superlink`` and ``supernode`` replace themselves with Flower's own executables, with the
flags a fedkit deployment needs; ``submit`` runs a fedkit config on the SuperNodes and waits
for it. The step by step, TLS included, is in docs/engines.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from fedkit_core.cli.options import (
    ClientsOpt,
    ConfigOpt,
    PluginOpt,
    RoundsOpt,
    SeedOpt,
    SetOpt,
    TaskOpt,
    console,
    finish,
    layers_of,
)

flower_app = typer.Typer(
    help="Run fedkit on a Flower deployment: SuperLink (server), SuperNodes (sites), runs.",
    no_args_is_help=True,
)

InsecureOpt = typer.Option(
    False, "--insecure", help="no TLS: plain HTTP (only for a test on one machine)"
)
CaCertOpt = typer.Option(None, "--ca-cert", help="PEM file of the CA that signed the SuperLink")
SuperlinkOpt = typer.Option(..., "--superlink", help="the SuperLink's HOST:PORT")


def _tls(insecure: bool, ca_cert: Path | None, cert: Path | None = None, key: Path | None = None):
    from fedkit_core.engines.flower.deploy import Tls

    return Tls(insecure=insecure, ca_cert=ca_cert, cert=cert, key=key)


def _exec(command: list[str]) -> None:
    """Become ``command``; Flower starts its helpers (flower-superexec, flwr-serverapp,
    flwr-clientapp) by name, so the folder of its executables goes first on PATH."""
    console.print(" ".join(command), style="dim")
    path = os.pathsep.join([str(Path(command[0]).parent), os.environ.get("PATH", "")])
    os.execve(command[0], command, {**os.environ, "PATH": path})


#: commands that hand any further arguments (after ``--``) to Flower's own command
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@flower_app.command(context_settings=PASS_THROUGH)
def superlink(
    ctx: typer.Context,
    address: str = typer.Option(
        "127.0.0.1:9091",
        "--address",
        help="HOST:PORT to serve the SuperNodes on (default: this machine only; give the "
        "internal address the sites reach, e.g. 10.0.0.5:9091)",
    ),
    insecure: bool = InsecureOpt,
    ca_cert: Path | None = CaCertOpt,
    cert: Path | None = typer.Option(None, "--cert", help="the SuperLink's certificate (PEM)"),
    key: Path | None = typer.Option(None, "--key", help="the SuperLink's private key (PEM)"),
    node_auth: bool | None = typer.Option(
        None,
        "--node-auth/--no-node-auth",
        help="admit only SuperNodes whose keys are registered (--node-keys, or `flwr "
        "supernode register` on the operator address); default: on with TLS (Flower needs "
        "TLS for it)",
    ),
    node_keys: list[Path] = typer.Option(
        [],
        "--node-keys",
        help="file of the SuperNodes' public keys (OpenSSH, one a line, the comment names "
        "the node; repeatable): fixed at start, no other node may join or be registered",
    ),
    control_address: str | None = typer.Option(
        None,
        "--control-address",
        help="HOST:PORT of run submission and node registration (Control API) and of the "
        "ServerApp (default: 127.0.0.1, the port after --address's: this machine only)",
    ),
    node_log: Path | None = typer.Option(
        None,
        "--node-log",
        help="folder of the log of the --node-keys' activations (node id, key, address, "
        "time; a second activation of an active key is a warning and an event of the run); "
        "default: a fresh private folder under the system's temporary folder",
    ),
) -> None:
    """Start the SuperLink (on the server). Runs until stopped.

    SuperNodes connect to --address; `fedkit flower submit` and `flwr` to --control-address.
    Arguments after ``--`` go to flower-superlink.
    """
    from fedkit_core.engines.flower.deploy import superlink_command

    tls = _tls(insecure, ca_cert, cert, key)
    command = superlink_command(address, tls, node_auth, control_address, node_keys, node_log)
    _exec([*command, *ctx.args])


@flower_app.command(context_settings=PASS_THROUGH)
def supernode(
    ctx: typer.Context,
    superlink: str = SuperlinkOpt,
    partition_id: int = typer.Option(
        ..., "--partition-id", help="which client this node serves (0, 1, ...)"
    ),
    data_path: str | None = typer.Option(
        None, "--data-path", help="this site's data (task.path on this node)"
    ),
    port: int = typer.Option(
        9094, "--port", help="local port for the node's ClientApp processes (one per node)"
    ),
    insecure: bool = InsecureOpt,
    ca_cert: Path | None = CaCertOpt,
    auth_key: Path | None = typer.Option(
        None,
        "--auth-key",
        help="this node's private key (its public key registered on the SuperLink with "
        "`flwr supernode register`), needed when the SuperLink authenticates nodes",
    ),
    warm: bool = typer.Option(
        False,
        "--warm/--no-warm",
        help="fedkit's fast layer (Flower internals, written for Flower 1.41 and 1.42; on "
        "another release Flower's plain SuperNode, with a warning): the ClientApp in one "
        "long-lived executor (data and client kept; each message answered in a worker "
        "forked from it), wake-ups instead of polls on the node, idle polls of the "
        "SuperLink backing off to 1 s; pair with `--set flower.fast=true` on submit. "
        "Default (--no-warm): Flower's own flower-supernode, a fresh flwr-clientapp "
        "process per message",
    ),
) -> None:
    """Start a SuperNode (on a site, next to its data). Runs until stopped.

    Arguments after ``--`` go to flower-supernode (e.g. ``-- --trusted-entities FILE``).
    """
    from fedkit_core.engines.flower.deploy import supernode_command
    from fedkit_core.engines.flower.fast import fast_layer

    tls = _tls(insecure, ca_cert)
    command = supernode_command(superlink, partition_id, data_path, port, tls, auth_key)
    if warm and fast_layer("fedkit flower supernode --warm"):
        # Flower's SuperNode, run by fedkit's wrapper (fedkit_core/engines/flower/warm.py)
        command = [sys.executable, "-m", "fedkit_core.engines.flower.warm", *command[1:]]
    _exec([*command, *ctx.args])


@flower_app.command()
def submit(
    superlink: str = SuperlinkOpt,
    nodes: int = typer.Option(
        ..., "--nodes", min=1, help="SuperNodes to wait for (one per client)"
    ),
    plugin: list[str] = PluginOpt,
    task: str | None = TaskOpt,
    config: Path | None = ConfigOpt,
    set_: list[str] = SetOpt,
    rounds: int | None = RoundsOpt,
    clients: int | None = ClientsOpt,
    seed: int | None = SeedOpt,
    out: Path | None = typer.Option(
        None, "--out", "-o", help="run directory, on the SuperLink's machine"
    ),
    insecure: bool = InsecureOpt,
    ca_cert: Path | None = CaCertOpt,
    wait: bool = typer.Option(True, "--wait/--no-wait", help="wait until the run has finished"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the run directory"),
) -> None:
    """Run a fedkit config on the SuperNodes of a SuperLink."""
    from fedkit_core.engines.flower.deploy import submit as submit_run
    from fedkit_core.resolve import resolve_config
    from fedkit_core.results.store import RunDir, default_out

    layers = layers_of(config, plugin, task, set_, rounds=rounds, clients=clients, seed=seed)
    layers.append({"engine": "flower", "flower.nodes": nodes})
    cfg, _ = resolve_config(layers)
    out = (out or default_out(cfg, create=False)).resolve()
    echo = (lambda _: None) if quiet else console.print
    submit_run(cfg, out, superlink, _tls(insecure, ca_cert), wait=wait, echo=echo)
    run_dir = RunDir(out)
    if wait and run_dir.results.is_file():
        finish(run_dir.load_results(), out, quiet)
    elif not quiet:
        console.print(f"results will be written on the SuperLink's machine in {out}")
