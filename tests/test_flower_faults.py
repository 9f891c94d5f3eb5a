"""Faults on the Flower engine (issue 18): a client that raises, hangs past
``client_timeout`` or exits its process fails alone; ``client_retries`` re-sends its message
from the state before it, and a run whose faults are all healed by retries gives the results
of a fault-free run. Faults come from the ``test-faults`` plugin (tests/fault_plugin), found
by name in every process (Ray workers, SuperNodes) through the Python path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from fedkit_core import run  # noqa: E402
from fedkit_core.testing import REPO_ROOT, tiny  # noqa: E402

FAULT_PLUGIN = Path(__file__).parent / "fault_plugin"


@pytest.fixture
def faults(monkeypatch, tmp_path):
    """``faults(*specs)``: the config layer that injects ``specs`` (see the plugin); the
    plugin's folder goes on this process's path and on its children's (Ray workers)."""
    monkeypatch.syspath_prepend(str(FAULT_PLUGIN))
    path = os.pathsep.join(filter(None, [str(FAULT_PLUGIN), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    counters = tmp_path / "attempts"
    counters.mkdir()

    def layer(*specs: str) -> dict:
        return {
            "plugins": ["test-faults"],
            "test-faults": {"faults": list(specs), "dir": str(counters)},
        }

    layer.attempts = lambda name: (counters / name).stat().st_size  # type: ignore[attr-defined]
    return layer


def flower(config: dict, backend: str = "thread", **extra) -> dict:
    return {**config, **extra, "engine": "flower", "flower": {"backend": backend}}


def same(a, b, tol: float) -> bool:
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
        )
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= tol
    return a == b


def assert_same_run(expected, got, tol: float = 1e-6) -> None:
    for scope in ("global", "clients", "clients_mean"):
        assert same(expected.final[scope], got.final[scope], tol), scope
    for mine, theirs in zip(expected.rounds, got.rounds, strict=True):
        assert mine["sampled"] == theirs["sampled"]
        assert same(mine["train"], theirs["train"], tol)


THREAD_FAULTS = ("raise:site0:1", "hang:site1:2", "sys-exit:site2:2")


@pytest.mark.slow
def test_thread_backend_faults_healed_by_a_retry_give_the_fault_free_results(faults):
    clean = run(flower(tiny(rounds=2)))
    healed = run(
        flower(tiny(rounds=2, client_retries=1, client_timeout=10), **faults(*THREAD_FAULTS))
    )
    assert healed["events"] == []
    assert_same_run(clean, healed, tol=0)
    assert [faults.attempts(n) for n in ("site0-r1", "site1-r2", "site2-r2")] == [2, 2, 2]


@pytest.mark.slow
def test_thread_backend_faults_without_retries_fail_only_that_client(faults, tmp_path):
    """In a process of its own: the run returns at the timeout and the process exits, though
    the hung client never returns."""
    config = flower(tiny(rounds=2, min_clients=1, client_timeout=10), **faults(*THREAD_FAULTS))
    script = (
        "import json, sys; from fedkit_core import run; r = run(json.loads(sys.argv[1])); "
        "print(json.dumps([r['status'], r['events'], sorted(r.rounds[1]['train'])]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config)],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ["PYTHONPATH"]]),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # tolerated failures are events, not tracebacks
    status, events, trained = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == "complete" and trained == ["site0"]
    errors = {(e["round"], e["phase"], e["client"]): e["error"] for e in events}
    assert errors == {
        (1, "fit", "site0"): "plugin 'test-faults' raised RuntimeError: injected fault in site0",
        (2, "fit", "site1"): "no reply within 10 s (client_timeout)",
        (2, "fit", "site2"): "the client exited (3)",
    }


@pytest.mark.slow
def test_ray_workers_that_exit_or_hang_fail_alone_and_retries_heal_them(faults, monkeypatch):
    """site0's worker process exits, site1 raises, then hangs (each once: healed by the
    retry); site2's worker exits on both attempts: only site2 fails its round, as a client
    that raises on every attempt does on the local engine. A Ray cluster address in the
    environment does not capture the simulation (it used to hang retrying to reach it)."""
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    config = tiny(rounds=2, min_clients=2, client_retries=1)
    ray = run(
        flower(
            {**config, "client_timeout": 20},
            backend="ray",
            **faults("exit:site0:1", "raise:site1:1", "hang:site1:2", "exit:site2:2:2"),
        )
    )
    local = run({**config, **faults("raise:site2:2:9")})  # workers run at this process's threads
    assert [(e["round"], e["client"]) for e in ray["events"]] == [(2, "site2")]
    assert "process exited" in ray["events"][0]["error"]
    assert_same_run(local, ray, tol=1e-5)


def _deployed_node(monkeypatch):
    """A deployed node's ClientApp side whose client does what each message's ``do`` says
    (``fine``: reply with its process id; ``hang``; ``die``) after setting its state, and a
    function that sends it one message and returns the reply and the state after it."""
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.app import Message as FlowerMessage
    from flwr.supercore.task_identity import TaskIdentity

    from fedkit_core.contract.messages import Message
    from fedkit_core.engines.flower import node
    from fedkit_core.engines.flower.records import from_records, to_records

    def answer(self, message_type, content, context):
        do = content.config_records["do"]["do"]
        context.state["kept"] = ConfigRecord({"v": {"fine": 2, "hang": 3, "die": 4}[do]})
        if do == "hang":
            time.sleep(60)
        if do == "die":
            os._exit(3)
        assert float(torch.ones(1 << 20).mul_(2).sum()) == 2 << 20  # multi-threaded in the child
        return to_records(Message("fit", scalars={"pid": os.getpid()}))

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # as in a ClientApp process
    monkeypatch.setattr(TaskIdentity, "_node_id", 2)
    monkeypatch.setattr(TaskIdentity, "_task_id", 3)
    monkeypatch.setattr(node.ClientSide, "_answer_content", answer)
    side = node.ClientSide(node.Source())
    config = json.dumps({"client_timeout": 2.0})

    def send(do):
        kept = RecordDict({"kept": ConfigRecord({"v": 1})})
        context = Context(1, 2, {}, kept, {"fedkit-config": config})
        content = RecordDict({"do": ConfigRecord({"do": do})})
        message = FlowerMessage(content, dst_node_id=2, message_type="train")
        reply = side(message, context)
        return from_records(reply.content, "fit"), dict(context.state.config_records["kept"])

    return side, send


@pytest.mark.slow
def test_a_deployed_node_answers_a_hung_or_exited_client_as_failed(monkeypatch):
    """With client_timeout, messages run in an isolated worker (a forked child) kept from
    one message to the next: its reply and state come back; a child that hangs past client_timeout is killed, one that exits is
    noticed, the state is kept, and the next message gets a new child."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the parent has an OpenMP team (a warm node has used torch)
    torch.ones(1 << 20).mul_(2)
    side, send = _deployed_node(monkeypatch)
    try:
        first, state = send("fine")
        assert first.error is None and state == {"v": 2}
        child = first.scalars["pid"]
        assert child != os.getpid()
        again, _ = send("fine")
        assert again.scalars["pid"] == child  # the same child answers the next message
        started = time.monotonic()
        reply, state = send("hang")
        assert reply.error == "no reply within 2 s (client_timeout)" and state == {"v": 1}
        assert time.monotonic() - started < 30
        after, state = send("fine")
        assert after.error is None and state == {"v": 2}
        assert after.scalars["pid"] != child  # a new child after the killed one
        reply, state = send("die")
        assert reply.error == "the client's process exited (exit code 3)" and state == {"v": 1}
        last, _ = send("fine")
        assert last.error is None
    finally:
        torch.set_num_threads(threads)
        if side.worker is not None:
            side.worker.close()


def test_flower_timeout_is_gone_in_favour_of_client_timeout():
    from fedkit_core import FedkitError
    from fedkit_core.resolve import resolve_config

    with pytest.raises(FedkitError, match="unknown config key 'flower.timeout'.*client_timeout"):
        resolve_config({"engine": "flower", "flower": {"timeout": 5}})
