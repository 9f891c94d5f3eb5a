"""Warm ClientApps for a deployed SuperNode (``fedkit flower supernode --warm``): part of
the fast layer (:mod:`.fast`), written for Flower 1.41 and 1.42's SuperNode internals.

Flower 1.41 runs every message a SuperNode receives in a fresh ``flwr-clientapp`` process,
which imports torch, Flower and fedkit again and reloads the client's data (about 2 s), and
its SuperNode, SuperExec and ServerApp poll each other every 0.5 to 3 s. A warm SuperNode:

* runs Flower's SuperNode with ``--isolation process`` and, in place of Flower's SuperExec,
  one long-lived *executor* process (:func:`executor`) that takes the node's tasks from the
  SuperNode's Runtime API and runs each ClientApp call in itself, with Flower's own
  functions (pull the task, load the app, push the reply and the context): imports, the
  data and the ClientApp stay loaded from one message to the next;
* keeps a misbehaving client from taking the executor down: fedkit's ClientApp answers
  every message in an isolated worker kept between messages
  (:mod:`fedkit_core.engines.isolation`), killed when it misses ``client_timeout`` and
  replaced for the next message;
* replaces polling on the node by wake-ups: the SuperNode tells the executor through a pipe
  when it stored a message, and the executor tells the SuperNode when it pushed the reply
  (Flower: the SuperExec polls every 1 s, the SuperNode its reply store every 0.5 s);
* polls the SuperLink every :data:`ACTIVE_POLL` seconds during a run and backs off to
  :data:`POLL` between runs (Flower: every 3 s), so a node asks for the next message soon
  after a round's phase without loading the SuperLink between runs;
* retries an object of a message that is not all stored yet after
  :data:`~.fast.OBJECT_RETRY` seconds (Flower: 1 s), here (and in the ServerApp with
  ``flower.fast=true``).

Without ``--warm`` (the default), or on a Flower release the fast layer was not written
for, the node is Flower's plain ``flower-supernode``.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

#: the longest pause between a SuperNode's polls of the SuperLink when idle (Flower: 3 s);
#: ``FEDKIT_SUPERNODE_POLL`` changes it
POLL = float(os.environ.get("FEDKIT_SUPERNODE_POLL", "1.0"))
#: the pause between polls for ACTIVE seconds after the node's last message (a run's next
#: message comes within a round; it cannot come before every client has replied and the
#: server has aggregated, so faster polls found nothing and loaded the SuperLink); then
#: each idle poll waits 1.5 times longer, up to POLL
ACTIVE_POLL, ACTIVE = 0.05, 10.0
#: the longest wait without a wake-up: the executor's check for a gone SuperNode, and the
#: SuperNode's for a reply
SAFETY = 1.0


def supernode_main(flower_args: list[str]) -> None:
    """Run Flower's SuperNode with ``flower_args``, warm (see the module docstring)."""
    port = flower_args[flower_args.index("--port") + 1] if "--port" in flower_args else "9094"
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # nothing leaves the site unasked
    task_read, task_write = os.pipe()  # SuperNode -> executor: a message is stored
    reply_read, reply_write = os.pipe()  # executor -> SuperNode: a reply is pushed
    worker = subprocess.Popen(
        [sys.executable, "-m", "fedkit_core.engines.flower.warm", "--executor",
         f"127.0.0.1:{port}", str(os.getpid()), str(task_read), str(reply_write)],
        pass_fds=(task_read, reply_write),
    )  # fmt: skip
    os.close(task_read)
    os.close(reply_write)
    try:
        from flwr.supernode import start_client_internal as loop
        from flwr.supernode.cli.flower_supernode import flower_supernode

        from fedkit_core.engines.flower.fast import retry_object_pulls_sooner

        pacer = Pacer(reply_read, task_write)
        loop._pull_and_store_message = pacer.wrap(loop._pull_and_store_message)  # type: ignore[attr-defined]
        loop.time = pacer.time_module()  # type: ignore[attr-defined]
        retry_object_pulls_sooner(loop)
        sys.argv = ["flower-supernode", *flower_args, "--isolation", "process"]
        flower_supernode()
    finally:
        worker.terminate()


class Pacer:
    """The waits of Flower's SuperNode loop (``flwr.supernode.start_client_internal``).

    The loop pulls a message from the SuperLink, then waits (``time.sleep``) until the
    ClientApp's reply is in its store and sends it; with nothing to pull it sleeps 3 s.
    Here a pulled message wakes the executor at once, the wait for a reply ends when the
    executor signals it, and an idle wait is :data:`ACTIVE_POLL` while a run is likely to
    send more, then grows to :data:`POLL`.
    """

    def __init__(self, reply_fd: int, task_fd: int):
        self.reply_fd = reply_fd
        self.task_fd = task_fd
        os.set_blocking(task_fd, False)
        self.idle = True
        self.pause = POLL
        self.last = -ACTIVE  # when the last message came (time.monotonic)

    def wrap(self, pull: Callable[..., int | None]) -> Callable[..., int | None]:
        def pull_and_store(*args: Any, **kwargs: Any) -> int | None:
            run_id = pull(*args, **kwargs)
            self.idle = run_id is None
            if not self.idle:
                self.pause = ACTIVE_POLL
                self.last = time.monotonic()
                _signal(self.task_fd)
            return run_id

        return pull_and_store

    def sleep(self, seconds: float) -> None:
        """Flower's ``time.sleep(seconds)`` in the loop: an idle pause, or a wait for a
        reply (or for an object of it) that the executor's signal ends."""
        if self.idle:
            wait = min(seconds, self.pause)
            active = time.monotonic() - self.last < ACTIVE
            self.pause = min(ACTIVE_POLL if active else POLL, self.pause * 1.5)
        else:
            wait = min(seconds, SAFETY)
        _wait(self.reply_fd, wait)

    def time_module(self) -> types.ModuleType:
        """``time`` for the loop's module, with :meth:`sleep` as its ``sleep``."""
        paced = types.ModuleType("time")
        paced.__dict__.update(time.__dict__)
        paced.sleep = self.sleep  # type: ignore[attr-defined]
        return paced


def _signal(fd: int) -> None:
    """Wake the process reading pipe ``fd`` (a full pipe is awake already)."""
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(fd, b"!")


def _wait(fd: int, seconds: float) -> bool:
    """Sleep up to ``seconds``, less if pipe ``fd`` is written to; take what it holds and
    say whether it held anything. A pipe whose writer is gone (it reads as ready for ever)
    is slept on plainly."""
    ready, _, _ = select.select([fd], [], [], max(seconds, 0.0))
    if not ready:
        return False
    if os.read(fd, 4096):
        return True
    time.sleep(seconds)
    return False


def executor(address: str, parent: int, task_fd: int, reply_fd: int) -> None:
    """Take the ClientApp tasks of the SuperNode whose Runtime API is at ``address`` and run
    them one after another in this process, until ``parent`` (the SuperNode) is gone.
    Waits on pipe ``task_fd`` for the SuperNode's signal of a new task; signals a pushed
    reply on ``reply_fd``."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    import fedkit_core.engines.flower.app  # noqa: F401  (torch, Flower, fedkit: once)
    from fedkit_core.engines.flower import node

    node.ALWAYS_ISOLATED = True  # a client must not take this long-lived process down

    _preload()
    os.set_blocking(reply_fd, False)
    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker(),
    )
    installed: set[str] = set()

    def acquire() -> str | None:
        got = client.AcquireTask(
            AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP], agentapp_fab_hashes=[])
        )
        return got.token if got.HasField("task") and got.token else None

    serve_tasks(
        acquire,
        lambda token: _run_task(address, token, installed),
        task_fd,
        reply_fd,
        alive=lambda: os.getppid() == parent,
    )


def serve_tasks(
    acquire: Callable[[], str | None],
    run: Callable[[str], None],
    task_fd: int,
    reply_fd: int,
    alive: Callable[[], bool],
) -> None:
    """The executor's loop: ``acquire`` a task (its token) and ``run`` it, then signal on
    ``reply_fd``, while ``alive()``. A task is asked for only after the SuperNode's signal
    on ``task_fd`` (and once at the start): Flower creates the task before it has stored the
    message's objects, and a task taken early waited 1 s or more for them."""
    signalled = True  # a task stored before this process listened has signalled already
    while alive():
        if signalled:
            token = acquire()
            if token is not None:
                run(token)
                _signal(reply_fd)
                continue  # another message may have been stored meanwhile
        signalled = _wait(task_fd, SAFETY)


def _preload() -> None:
    """Import here what torch imports lazily on a client's first step, so that each
    message's forked child inherits it: the first optimizer imports ``torch._dynamo``
    (about 2 s of CPU), which a child would otherwise import again for every message."""
    import torch

    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    weight.sum().backward()
    optimizer.step()


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
        executor(sys.argv[2], *map(int, sys.argv[3:6]))
    else:
        supernode_main(sys.argv[1:])
