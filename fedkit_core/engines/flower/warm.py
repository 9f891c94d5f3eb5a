"""Warm ClientApp processes for a deployed SuperNode (``fedkit flower supernode``).

Flower 1.41 runs every message a SuperNode receives in a fresh ``flwr-clientapp`` process,
which imports torch, Flower and fedkit again (about 2 s), and its SuperNode, SuperExec and
ServerApp poll each other every 0.5 to 3 s. A warm SuperNode keeps Flower's own process
model (one process per message: a message that hangs or crashes takes only its process
down) but makes each process cheap and the waits short:

* a *fork server* imports everything a ClientApp needs once; the ``flwr-clientapp`` that
  Flower's SuperExec starts by name is a small stand-in (first on the SuperNode's PATH) that
  asks the fork server for a child, which runs Flower's own ``flwr-clientapp`` entry point
  with the same arguments (falling back to the real executable if the server is not up);
* the SuperNode's idle wait and reply polling are cut to :data:`POLL` seconds, the
  SuperExec's task polling to 0.05 s (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``).

``--no-warm`` gives Flower's plain SuperNode (the former behaviour), e.g. to compare.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

#: seconds between a SuperNode's polls of the SuperLink when idle (Flower: 3 s) and of
#: its own reply store (Flower: 0.5 s); ``FEDKIT_SUPERNODE_POLL`` changes it
POLL = float(os.environ.get("FEDKIT_SUPERNODE_POLL", "0.1"))
SOCKET_ENV, REAL_ENV = "FEDKIT_CLIENTAPP_SOCKET", "FEDKIT_REAL_CLIENTAPP"

STAND_IN = """#!{python} -S
# fedkit's stand-in for flwr-clientapp (see fedkit_core/engines/flower/warm.py)
import json, os, socket, sys
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["{socket_env}"])
    s.sendall(json.dumps(sys.argv[1:]).encode() + b"\\n")
    ok = s.recv(1) == b"1"
except OSError:
    ok = False
if not ok:
    real = os.environ["{real_env}"]
    os.execv(real, [real, *sys.argv[1:]])
"""


def supernode_main(flower_args: list[str]) -> None:
    """Run Flower's SuperNode with ``flower_args``, warm (see the module docstring)."""
    real = shutil.which("flwr-clientapp")
    if real is None:
        raise SystemExit("flwr-clientapp not found beside flower-supernode")
    home = Path(tempfile.mkdtemp(prefix="fedkit-warm-"))
    stand_in = home / "flwr-clientapp"
    stand_in.write_text(
        STAND_IN.format(python=sys.executable, socket_env=SOCKET_ENV, real_env=REAL_ENV)
    )
    stand_in.chmod(0o755)
    os.environ[SOCKET_ENV] = str(home / "fork.sock")
    os.environ[REAL_ENV] = real
    os.environ["PATH"] = os.pathsep.join([str(home), os.environ.get("PATH", "")])
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.05")
    server = subprocess.Popen(
        [sys.executable, "-m", "fedkit_core.engines.flower.warm", "--fork-server",
         str(home / "fork.sock"), str(os.getpid())]
    )  # fmt: skip
    try:
        from flwr.supernode import start_client_internal
        from flwr.supernode.cli.flower_supernode import flower_supernode

        start_client_internal.time = _fast_time()  # type: ignore[attr-defined]
        sys.argv = ["flower-supernode", *flower_args]
        flower_supernode()
    finally:
        server.terminate()
        shutil.rmtree(home, ignore_errors=True)


def _fast_time() -> types.ModuleType:
    """``time`` for the SuperNode's loop, whose waits last at most :data:`POLL` seconds."""
    fast = types.ModuleType("time")
    fast.__dict__.update(time.__dict__)
    fast.sleep = lambda seconds: time.sleep(min(seconds, POLL))  # type: ignore[attr-defined]
    return fast


def fork_server(path: str, parent: int) -> None:
    """Serve forks of this process, warm with torch, Flower and fedkit, until ``parent``
    (the SuperNode) is gone. Each child runs one ``flwr-clientapp`` with the arguments the
    stand-in sent."""
    import torch  # noqa: F401  (the expensive imports, done once)
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

    import fedkit_core.engines.flower.app  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            args = json.loads(conn.makefile().readline())
            if os.fork() == 0:
                listener.close()
                conn.sendall(b"1")
                conn.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sys.argv = ["flwr-clientapp", *args]
                code = 0
                try:
                    flwr_clientapp()
                except SystemExit as done:
                    code = done.code if isinstance(done.code, int) else 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fork-server"]:
        fork_server(sys.argv[2], int(sys.argv[3]))
    else:
        supernode_main(sys.argv[1:])
