"""Warm ClientApps for a deployed SuperNode (``fedkit flower supernode``).

Flower 1.41 runs every message a SuperNode receives in a fresh ``flwr-clientapp`` process,
which imports torch, Flower and fedkit again and reloads the client's data (about 2 s), and
its SuperNode, SuperExec and ServerApp poll each other every 0.5 to 3 s. A warm SuperNode:

* runs Flower's SuperNode with ``--isolation process`` and, in place of Flower's SuperExec,
  one long-lived *executor* process (:func:`executor`) that takes the node's tasks from the
  SuperNode's Runtime API and runs each ClientApp call in itself, with Flower's own
  functions (pull the task, load the app, push the reply and the context): imports, the
  data and the ClientApp stay loaded from one message to the next;
* keeps a misbehaving client from taking the executor down: fedkit's ClientApp answers each
  message in a forked child (:mod:`.node`), killed when it misses ``client_timeout``;
* cuts the SuperNode's idle wait and reply polling to :data:`POLL` seconds (Flower: 3 s and
  0.5 s) and the executor's task polling to 0.02 s.

``--no-warm`` gives Flower's plain SuperNode (the former behaviour), e.g. to compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

#: seconds between a SuperNode's polls of the SuperLink when idle (Flower: 3 s) and of
#: its own reply store (Flower: 0.5 s); ``FEDKIT_SUPERNODE_POLL`` changes it
POLL = float(os.environ.get("FEDKIT_SUPERNODE_POLL", "0.1"))


def supernode_main(flower_args: list[str]) -> None:
    """Run Flower's SuperNode with ``flower_args``, warm (see the module docstring)."""
    port = flower_args[flower_args.index("--port") + 1] if "--port" in flower_args else "9094"
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # nothing leaves the site unasked
    worker = subprocess.Popen(
        [sys.executable, "-m", "fedkit_core.engines.flower.warm", "--executor",
         f"127.0.0.1:{port}", str(os.getpid())]
    )  # fmt: skip
    try:
        from flwr.supernode import start_client_internal
        from flwr.supernode.cli.flower_supernode import flower_supernode

        start_client_internal.time = _fast_time()  # type: ignore[attr-defined]
        sys.argv = ["flower-supernode", *flower_args, "--isolation", "process"]
        flower_supernode()
    finally:
        worker.terminate()


def _fast_time() -> types.ModuleType:
    """``time`` for the SuperNode's loop, whose waits last at most :data:`POLL` seconds."""
    fast = types.ModuleType("time")
    fast.__dict__.update(time.__dict__)
    fast.sleep = lambda seconds: time.sleep(min(seconds, POLL))  # type: ignore[attr-defined]
    return fast


def executor(address: str, parent: int) -> None:
    """Take the ClientApp tasks of the SuperNode whose Runtime API is at ``address`` and run
    them one after another in this process, until ``parent`` (the SuperNode) is gone."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    import fedkit_core.engines.flower.app  # noqa: F401  (torch, Flower, fedkit: once)

    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker(),
    )
    installed: set[str] = set()
    while os.getppid() == parent:
        got = client.AcquireTask(
            AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP], agentapp_fab_hashes=[])
        )
        if got.HasField("task") and got.token:
            _run_task(address, got.token, installed)
        else:
            time.sleep(0.02)


def _run_task(address: str, token: str, installed: set[str]) -> None:
    """One ClientApp task, as Flower's ``flwr-clientapp`` process runs it (see
    ``flwr.supernode.runtime.run_clientapp``), in this process."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supernode.runtime.run_clientapp import (
        pull_task_input,
        push_message,
        push_task_output,
    )

    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=[
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(token),
        ],
        retry_invoker=make_simple_http_retry_invoker(),
    )
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    context, status, details = None, SubStatus.FAILED, "ClientApp failed"
    try:
        message, context, run, fab = pull_task_input(client)
        if fab.hash_str not in installed:
            install_from_fab(fab.content, skip_prompt=True)
            installed.add(fab.hash_str)
        try:
            app = get_load_client_app_fn("", None, multi_app=True)(
                run.fab_id, run.fab_version, fab.hash_str
            )
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as err:  # as flwr-clientapp does: an error reply, context unchanged
            reason = f"{type(err)}:<'{err}'>"
            reply = Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message
            )
            details = reason
        push_message(client, reply, context)
    except Exception as err:  # noqa: BLE001 - the SuperNode answers the message as failed
        print(f"fedkit executor: task failed: {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        push_task_output(client=client, context=context, sub_status=status, details=details)
        heartbeat.stop()
        client.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--executor"]:
        executor(sys.argv[2], int(sys.argv[3]))
    else:
        supernode_main(sys.argv[1:])
