"""The Flower engine gives the local engine's results, keeps client state in Flower's context,
carries extra round trips as Flower messages, survives failing clients and resumes runs.

Most runs use the ``thread`` backend (the fast layer's: Flower's simulation runtime without
Ray, fast and in this process, so throwaway plugins work); the public path (Flower's Ray
backend) and the loopback deployment are exercised by tests marked ``slow``, the Ray backend
also by one in test_flower_faults.py (its faulty run, healed by retries, gives the local
engine's results).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

flwr = pytest.importorskip("flwr")

from fedkit_core import FedkitError, Reply, hookimpl, resume, run  # noqa: E402
from fedkit_core.aggregation import weighted_average  # noqa: E402
from fedkit_core.cli import main  # noqa: E402
from fedkit_core.contract.messages import Message  # noqa: E402
from fedkit_core.contract.observer import Observer  # noqa: E402
from fedkit_core.engines.flower import node as node_module  # noqa: E402
from fedkit_core.engines.flower.records import from_records, to_records  # noqa: E402
from fedkit_core.engines.flower.serverapp import FlowerTransport, wait_for_nodes  # noqa: E402
from fedkit_core.engines.workers import cpu_cores  # noqa: E402
from fedkit_core.errors import ClientFailure  # noqa: E402
from fedkit_core.testing import REPO_ROOT, tiny  # noqa: E402

THREAD = {"engine": "flower", "flower": {"backend": "thread"}}


def flower(config: dict, backend: str = "thread") -> dict:
    return {
        **config,
        "engine": "flower",
        "flower": {**config.get("flower", {}), "backend": backend},
    }


def close(a, b, tol: float) -> bool:
    """Numbers within ``tol``, everything else equal, recursively."""
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
        )
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return isinstance(b, (int, float)) and abs(a - b) <= tol
    return a == b


def assert_same_results(local, other, tol: float = 1e-6) -> None:
    """Same final metrics in every scope and same per-round training records."""
    for scope in ("global", "clients", "clients_mean", "fairness", "summary", "views", "bytes"):
        assert close(local.final[scope], other.final[scope], tol), (
            scope,
            local.final[scope],
            other.final[scope],
        )
    for mine, theirs in zip(local.rounds, other.rounds, strict=True):
        assert theirs["sampled"] == mine["sampled"]
        assert close(mine["train"], theirs["train"], tol), (mine["train"], theirs["train"])


# ---------------------------------------------------------------------- throwaway plugins


class Personal:
    """Client state of every kind: a private personal head (used for evaluation), a plugin
    state counter reported up, and (with keep_optimizer_state) the optimiser's moments."""

    @hookimpl
    def fedkit_extend_model(self, model, ctx):
        if ctx.client_id is not None:
            head = nn.Linear(model.feature_dim, ctx.task.num_classes)
            model.add_extra("personal", head, private=True)

    @hookimpl
    def fedkit_round_start(self, client):
        state = client.state
        state["fits"] = state.get("fits", 0) + 1
        state["trace"] = (
            state.get("trace", torch.zeros(())) + client.model.head.weight.detach().sum()
        )

    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        return {"personal.ce": nn.functional.cross_entropy(outputs["personal"], batch.y)}

    @hookimpl
    def fedkit_client_report(self, client):
        state = client.state
        return {"personal.fits": state["fits"], "personal.trace": float(state["trace"])}

    @hookimpl
    def fedkit_eval_views(self, client):
        return {"personal": "personal"}

    @hookimpl
    def fedkit_client_view(self, client):
        return "personal"


class Anchored:
    """An extra round trip after local training: each client answers with a statistic of its
    locally trained weights against the anchor the server sends (like Fed-LWR's CKA); the
    server weights the average by the answers."""

    @hookimpl
    def fedkit_answer_query(self, client, query, arrays, scalars):
        if query != "anchored.dot":
            return None
        local = client.model.head.weight.detach().cpu()
        dot = float((local * arrays["anchor"]).sum())
        return Reply(arrays={"norm": local.norm().reshape(1)}, scalars={"dot": dot, "tag": "ok"})

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        anchor = server.global_state["head.weight"]
        replies = ask("anchored.dot", arrays={"anchor": anchor}, scalars={"scale": 2.0})
        for update in updates:  # the reply is computed on the model the client just trained
            expected = float((update.arrays["head.weight"] * anchor).sum())
            got = replies[update.client_id].scalars["dot"]
            assert abs(got - expected) <= 1e-4 * max(1.0, abs(expected)), (got, expected)
            assert replies[update.client_id].scalars["tag"] == "ok"
        weights = [1.0 + abs(replies[u.client_id].scalars["dot"]) for u in updates]
        server.state["weights"] = weights
        return weighted_average([u.arrays for u in updates], weights)


class Flaky:
    """One client fails in round 2's training."""

    @hookimpl
    def fedkit_round_start(self, client):
        if client.id == "site1" and client.round == 2:
            raise FedkitError("site1 lost its data")


# ---------------------------------------------------------------------- equivalence


@pytest.mark.slow
def test_fedavg_gives_the_local_engines_results():
    local = run(tiny(rounds=2))
    other = run(flower(tiny(rounds=2)))
    assert_same_results(local, other)
    assert other["config"]["engine"] == "flower"


@pytest.mark.slow
def test_client_state_persists_in_flowers_context_even_across_processes(monkeypatch):
    config = tiny(rounds=3, keep_optimizer_state=True)
    local = run(config, plugins={"personal": Personal()})

    # every message handled as if by a fresh process: the client is rebuilt from
    # Context.state each time (what Ray workers and deployed SuperNodes do)
    real = node_module.ClientSide.client

    def forgetful(self, context):
        self.clients.clear()
        return real(self, context)

    monkeypatch.setattr(node_module.ClientSide, "client", forgetful)
    other = run(flower(config), plugins={"personal": Personal()})
    assert_same_results(local, other)
    fits = [r["train"]["site0"]["personal.fits"] for r in other.rounds]
    assert fits == [1, 2, 3]


@pytest.mark.slow
def test_extra_round_trip_is_a_flower_message_answered_by_the_trained_model(monkeypatch):
    config = tiny(rounds=2)
    local = run(config, plugins={"anchored": Anchored()})
    real = node_module.ClientSide.client

    def forgetful(self, context):  # the query lands in another "process" than the fit
        self.clients.clear()
        return real(self, context)

    monkeypatch.setattr(node_module.ClientSide, "client", forgetful)
    other = run(flower(config), plugins={"anchored": Anchored()})
    assert_same_results(local, other)


# ---------------------------------------------------------------------- failures


@pytest.mark.slow
def test_failing_client_is_recorded_and_the_run_goes_on(tmp_path):
    config = flower(tiny(rounds=3, min_clients=2))
    results = run(config, plugins={"flaky": Flaky()}, out=tmp_path / "run")
    assert results["status"] == "complete"
    (event,) = results["events"]
    assert event == {"round": 2, "phase": "fit", "client": "site1", "error": "site1 lost its data"}
    assert results.rounds[1]["sampled"] == ["site0", "site1", "site2"]
    assert set(results.rounds[1]["train"]) == {"site0", "site2"}
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["events"] == results["events"]
    # a simulation's nodes are Flower's simulated ones: their ids, nothing more to name
    assert saved["nodes"]["source"] == "simulation"
    assert set(saved["nodes"]["clients"]) == {"site0", "site1", "site2"}
    local = run(tiny(rounds=3, min_clients=2), plugins={"flaky": Flaky()})
    assert local["events"] == results["events"] and "nodes" not in local
    assert close(local.final["global"], results.final["global"], 1e-6)


@pytest.mark.slow
def test_too_few_clients_left_is_a_clear_error():
    with pytest.raises(FedkitError, match="site1 lost its data"):
        run(flower(tiny(rounds=2)), plugins={"flaky": Flaky()})


@pytest.fixture
def server_identity(monkeypatch):
    """The task identity Flower gives a ServerApp's process (a message built on the server
    reads it), so the transport tests do not depend on an earlier test's simulation."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


class FakeGrid:
    """A Grid whose nodes reply, fail or stay silent, for transport tests; a node that is
    ``"flaky"`` fails its first message and answers the next."""

    def __init__(self, behaviour: dict[int, str]):
        self.behaviour = behaviour
        self.replies: dict[str, object] = {}
        self.sent: list[int] = []

    def get_node_ids(self):
        return list(self.behaviour)

    def push_messages(self, messages):
        from flwr.app import Error
        from flwr.app import Message as FlowerMessage

        ids = []
        for message in messages:
            mid = f"m{len(self.sent)}"
            message.metadata.__dict__["_message_id"] = mid  # as Flower's push does
            node = message.metadata.dst_node_id
            self.sent.append(node)
            what = self.behaviour[node]
            if what == "flaky":
                what = "error" if self.sent.count(node) == 1 else "ok"
            if what == "ok":
                echo = from_records(message.content, "fit")
                reply = FlowerMessage(to_records(echo), reply_to=message)
            elif what == "error":  # Flower's own error reply: it comes from the SuperLink
                reply = FlowerMessage(Error(code=5, reason="node unavailable"), reply_to=message)
            if what != "silent":
                self.replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(mid) for mid in message_ids if mid in self.replies]


def test_transport_turns_silent_and_erroring_nodes_into_failed_replies(server_identity):
    transport = FlowerTransport(FakeGrid({2: "ok", 3: "error", 4: "silent"}), Observer(), 0.5)
    transport.nodes = {"a": 2, "b": 3, "c": 4}
    sent = Message("fit", {"w": torch.arange(3.0)}, {"round": 1, "lr": 0.1, "tag": "x"})
    replies = transport.send({"a": sent, "b": sent, "c": sent})
    assert torch.equal(replies["a"].arrays["w"], sent.arrays["w"])
    assert replies["a"].scalars == sent.scalars and replies["a"].error is None
    assert "Flower error 5: node unavailable" in replies["b"].error
    assert "no reply within 0.5 s" in replies["c"].error


def test_transport_resends_failed_messages_client_retries_times(server_identity):
    grid = FakeGrid({2: "ok", 3: "flaky", 4: "error"})
    transport = FlowerTransport(grid, Observer(), retries=2)
    transport.nodes = {"a": 2, "b": 3, "c": 4}
    sent = Message("fit", {"w": torch.arange(3.0)}, {"round": 1})
    replies = transport.send({"a": sent, "b": sent, "c": sent})
    assert replies["a"].error is None and replies["b"].error is None  # healed by a retry
    assert "node unavailable" in replies["c"].error
    assert sorted(grid.sent) == [2, 3, 3, 4, 4, 4]  # only failed messages are sent again


def test_transport_pushes_and_hands_back_replies_as_they_come(server_identity):
    """Asynchronous aggregation on a deployment: messages go out without waiting, replies
    come back as they arrive (in client order when several came together); a node silent
    past the deadline gets a failed reply."""
    transport = FlowerTransport(FakeGrid({2: "ok", 3: "silent", 4: "error"}), Observer(), 0.3)
    transport.nodes = {"a": 2, "b": 3, "c": 4}
    sent = Message("fit", {"w": torch.arange(3.0)}, {"round": 1})
    transport.push({"c": sent, "b": sent, "a": sent})
    first = transport.pull()
    assert [cid for cid, _ in first] == ["a", "c"]
    assert first[0][1].error is None and torch.equal(first[0][1].arrays["w"], sent.arrays["w"])
    assert "node unavailable" in first[1][1].error
    (late,) = transport.pull()
    assert late[0] == "b" and "no reply in time" in late[1].error
    assert transport.waiting == {}


SLOW_SITE = {  # site2 ten times slower than the others
    "base": {"samples_per_second": 100},
    "profiles": {"fast": {"compute": "1x"}, "slow": {"compute": "0.1x"}},
    "clients": {"site2": "slow", "*": "fast"},
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fedbuff", "deadline"])
def test_aggregation_modes_in_simulated_time_give_the_local_engines_results(mode):
    config = tiny(rounds=2, sites=SLOW_SITE, aggregation=mode)
    if mode == "deadline":
        config["deadline"] = 2.0
    local, simulated = run(config), run(flower(config))
    assert_same_results(local, simulated)
    for mine, theirs in zip(local.rounds, simulated.rounds, strict=True):
        assert mine["simulated_seconds"] == theirs["simulated_seconds"]
        assert mine.get("updates") == theirs.get("updates")
    assert local["events"] == simulated["events"]


def test_a_ray_worker_unpickles_the_client_app_into_one_client_side_per_run():
    # Flower's Ray backend pickles the ClientApp with every message; a worker must keep one
    # ClientSide (and its clients and data) for the run, not one a message
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    app = node_module.make_client_app(node_module.Source(threads=torch.get_num_threads()))
    first = cloudpickle.loads(cloudpickle.dumps(app)).fedkit_side  # what each Ray call does
    again = cloudpickle.loads(cloudpickle.dumps(app)).fedkit_side
    assert first is again and first is not app.fedkit_side
    assert first.token == app.fedkit_side.token
    other = node_module.make_client_app(node_module.Source())  # another run
    assert cloudpickle.loads(cloudpickle.dumps(other)).fedkit_side is not first


# ---------------------------------------------------------------------- the fast layer


def test_the_fast_layer_is_written_for_flower_1_41_and_1_42_only():
    from fedkit_core.engines.flower.fast import supported

    assert supported("1.41.0") and supported("1.42.0") and supported("1.42.3")
    assert not supported("1.43.0") and not supported("1.40.1") and not supported("none")


def test_the_fast_layer_switches_off_with_one_warning_on_another_flower(monkeypatch, caplog):
    from fedkit_core.engines.flower import fast

    monkeypatch.setattr(fast, "flower_version", lambda: "1.43.0")
    monkeypatch.setattr(fast, "_warned", False)
    with caplog.at_level("WARNING", logger="fedkit"):
        assert not fast.fast_layer("flower.backend=thread")
        assert not fast.fast_layer("flower.fast")
        assert not fast.fast_layer("flower.backend=thread")
    (record,) = [r for r in caplog.records if "fast layer" in r.getMessage()]
    assert "flwr 1.43.0" in record.getMessage() and "1.41 and 1.42" in record.getMessage()
    monkeypatch.setattr(fast, "flower_version", lambda: "1.42.0")
    assert fast.fast_layer("flower.backend=thread")


@pytest.mark.slow
def test_thread_backend_on_another_flower_runs_the_public_path_to_the_same_results(
    monkeypatch, caplog
):
    """On a Flower release the fast layer was not written for, ``flower.backend=thread``
    falls back to Flower's own Ray backend (public API only), with one warning, and the
    run gives the local engine's results."""
    pytest.importorskip("ray")
    from fedkit_core.engines.flower import fast

    monkeypatch.setattr(fast, "flower_version", lambda: "1.43.0")
    monkeypatch.setattr(fast, "_warned", False)
    used = []
    monkeypatch.setattr(fast, "thread_backend", lambda: used.append("thread"))
    config = tiny(rounds=2)
    with caplog.at_level("WARNING", logger="fedkit"):
        public = run(flower(config))
    assert used == []  # Flower's Ray backend ran the ClientApps
    warned = [r for r in caplog.records if "fast layer" in r.getMessage()]
    assert len(warned) == 1
    assert_same_results(run(config), public)


def test_waiting_for_missing_supernodes_fails_clearly():
    with pytest.raises(FedkitError, match="only 2 of 3 SuperNodes connected"):
        wait_for_nodes(FakeGrid({1: "ok", 2: "ok"}), 3, patience=0.3)


def test_more_supernodes_than_clients_is_refused():
    with pytest.raises(FedkitError, match="3 SuperNodes are connected but flower.nodes=2"):
        wait_for_nodes(FakeGrid({1: "ok", 2: "ok", 3: "ok"}), 2, patience=0.3)


def test_records_keep_names_dtypes_and_scalar_types():
    arrays = {"a.weight": torch.randn(2, 3), "n": torch.tensor(7), "mask": torch.tensor([True])}
    scalars = {"round": 3, "lr": 0.5, "name": "x", "flag": False}
    back = from_records(to_records(Message("fit", arrays, scalars)), "fit")
    assert back.scalars == scalars
    assert {k: type(v) for k, v in back.scalars.items()} == {k: type(v) for k, v in scalars.items()}
    for key, value in arrays.items():
        assert back.arrays[key].dtype == value.dtype and torch.equal(back.arrays[key], value)
    failed = from_records(
        to_records(Message("fit", error="bad", exception=FedkitError("bad"))), "fit"
    )
    assert failed.error == "bad" and isinstance(failed.exception, FedkitError)


class Stop:
    """Every client fails in the training of round ``at`` (never with None)."""

    def __init__(self, at: int | None = None):
        self.at = at

    @hookimpl
    def fedkit_round_start(self, client):
        if client.round == self.at:
            raise RuntimeError("power cut")


@pytest.mark.slow
def test_a_crashed_run_resumes_on_flower_to_the_uninterrupted_results(tmp_path):
    config = flower(tiny(rounds=3, checkpoint=True, keep_optimizer_state=True))

    def plugins(stop_at=None):
        return {"personal": Personal(), "anchored": Anchored(), "stop": Stop(stop_at)}

    straight = run(config, plugins=plugins())
    out = tmp_path / "run"
    with pytest.raises(ClientFailure, match="power cut"):
        run(config, plugins=plugins(stop_at=3), out=out)
    assert json.loads((out / "checkpoint" / "latest.json").read_text())["round"] == 2
    resumed = resume(out, plugins=plugins())
    assert_same_results(straight, resumed, tol=0)
    # private head, plugin state and optimiser moments came back from each node's checkpoint
    assert [r["train"]["site0"]["personal.fits"] for r in resumed.rounds] == [1, 2, 3]
    for cid in ("site0", "site1", "site2"):
        kept = sorted(p.name for p in (out / "checkpoint" / "clients" / cid).glob("*.pt"))
        assert kept == ["r2.pt", "r3.pt"]


@pytest.mark.slow
def test_cli_runs_and_resumes_on_flower(tmp_path, capsys):
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny(rounds=1, checkpoint=True)))
    out = tmp_path / "run"
    argv = ["run", "--config", str(path), "--engine", "flower", "--set", "flower.backend=thread"]
    assert main([*argv, "--out", str(out), "-q"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and (out / "metrics.csv").is_file()
    assert main(["resume", str(out), "-q"]) == 0  # a complete run is returned as it is
    assert json.loads((out / "results.json").read_text()) == results


# ---------------------------------------------------------------------- installed methods


@pytest.mark.slow
def test_fca_gives_the_local_engines_results():
    pytest.importorskip("fedkit_fca")
    config = tiny(rounds=3, plugins=["fca"])
    assert_same_results(run(config), run(flower(config)))


@pytest.mark.slow
def test_ray_backend_by_default_gives_the_local_engines_results_bit_for_bit():
    """Default settings, a stateful plugin (FCA's private heads) and Flower's Ray backend:
    the workers run at this process's torch threads, so every number is the local engine's.
    With one thread per worker (flower.client_cpus=1, the former default) the training
    losses already differed in round 1."""
    pytest.importorskip("fedkit_fca")
    pytest.importorskip("ray")
    config = tiny(rounds=2, plugins=["fca"])
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, cpu_cores()))  # where 1 and 2 threads differ
    try:
        assert_same_results(run(config), run(flower(config, backend="ray")), tol=0)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_fed_lwr_gives_the_local_engines_results():
    pytest.importorskip("fedkit_fed_lwr")
    config = tiny(rounds=3, plugins=["fed-lwr"])
    assert_same_results(run(config), run(flower(config)))


# ---------------------------------------------------------------------- slow


def _flower_processes(marker: str) -> set[int]:
    """Live Flower/fedkit-on-Flower processes started with ``marker`` in their environment
    (so runs of other users or sessions on the same machine are not counted)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split()[2]
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            state != "Z"
            and marker.encode() in environ
            and any(
                name in cmdline
                for name in (
                    "flower-",
                    "flwr-",
                    "fedkit_core.cli flower",
                    "fedkit_core.engines.flower",
                )
            )
        ):
            found.add(int(entry.name))
    return found


DEPLOY_SCRIPT = REPO_ROOT / "examples" / "flower" / "deploy_local.sh"


def _deploy(out: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    """examples/flower/deploy_local.sh into ``out`` with ``args`` for `fedkit flower
    submit` and ``env`` (INTRUDER, STOLEN, ...), the test's fault plugin importable; checks
    that it succeeded and left no process of its own behind."""
    marker = f"FEDKIT_TEST_RUN={uuid.uuid4().hex}"  # tells this run's processes from others'
    plugin = Path(__file__).parent / "fault_plugin"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(
            [str(plugin), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
        ),
        "FEDKIT_TEST_RUN": marker.split("=", 1)[1],
        **env,
    }
    done = subprocess.run(
        ["bash", str(DEPLOY_SCRIPT), str(out), "-q", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _flower_processes(marker) == set()
    return done


def _sections(stdout: str, first: str) -> dict[str, str]:
    """The script's ``---- TITLE`` sections from the one titled ``first`` on: title ->
    text (the title up to its first space or parenthesis)."""
    said = stdout.split(f"---- {first}", 1)[1]
    parts = (f"{first}{said}").split("\n---- ")
    return {part.split(" ", 1)[0].split("\n", 1)[0]: part.split("\n", 1)[1] for part in parts}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to list processes")
def test_loopback_deployment_gives_the_local_results_and_leaves_no_process(tmp_path):
    """The loopback deployment runs as a real one does: TLS, SuperNode authentication with
    the hospitals' keys fixed at the SuperLink's start, the run submitted to the operator
    address. An outsider with the public ca.crt and a key of its own is refused whatever it
    tries: registering its key or unregistering a hospital's node (on either address),
    listing or submitting runs on the SuperNodes' address, joining with its SuperNode. One
    client raises in round 1 and another's ClientApp process exits in round 2: each retry
    (client_retries=1) heals it, so the results are still the local engine's. The nodes are
    Flower's own ``flower-supernode`` (the public path); with ``client_timeout`` set the
    ClientApp answers in an isolated worker, which turns the exit into a failed reply."""
    out = tmp_path / "deployed"
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    faults = ["--plugin", "test-faults", "--set", "test-faults.faults=[raise:site1:1,exit:site0:2]"]
    faults += ["--set", f"test-faults.dir={attempts}", "--set", "client_retries=1"]
    faults += ["--set", "client_timeout=300"]
    done = _deploy(out, faults, INTRUDER="1")
    said = _sections(done.stdout, "outsider")
    tried, intruder, nodes = said["outsider"], said["intruder.log"], said["nodes"]
    outcomes = dict(line.split(": ", 1) for line in tried.strip().splitlines())
    not_served = "is not served on the SuperNodes' address"
    fixed = "keys are fixed by the operator at start"
    expected = {
        "register-on-fleet": not_served,
        "register-on-control": fixed,
        "list-on-fleet": not_served,
        "unregister-on-fleet": not_served,
        "unregister-on-control": fixed,
        "list-runs-on-fleet": not_served,
        "submit-on-fleet": not_served,
    }
    assert set(outcomes) == set(expected), outcomes
    for attempt, refusal in expected.items():
        assert refusal in outcomes[attempt] and '"success": true' not in outcomes[attempt]
    assert outcomes["submit-on-fleet"].startswith("exit 2: error: the SuperLink refused the run")
    assert "Failed to activate SuperNode" in intruder, intruder
    held = json.loads(nodes)["nodes"]  # the three hospitals' and no other, all online
    assert [n["owner-name"] for n in held] == ["operator (--node-keys)"] * 3, held
    assert all(n["status"] == "online" for n in held)
    deployed = json.loads((out / "results.json").read_text())
    # the outsider's own key is no second activation of a hospital's: no event
    assert deployed["status"] == "complete" and deployed["events"] == []
    served = deployed["nodes"]["clients"]
    assert deployed["nodes"]["source"] == "superlink"
    assert [served[f"site{k}"]["key"] for k in range(3)] == [
        "hospital-0",
        "hospital-1",
        "hospital-2",
    ]
    assert all(s["address"].startswith("127.0.0.1:") for s in served.values())
    held_ids = sorted(int(n["node-id"]) for n in held)  # `flwr supernode list` says them as text
    assert sorted(s["node_id"] for s in served.values()) == held_ids
    assert sorted(p.name for p in attempts.iterdir()) == ["site0-r2", "site1-r1"]
    assert all(p.stat().st_size == 2 for p in attempts.iterdir())  # failed once, then healed
    assert (out / "metrics.csv").is_file()
    import yaml

    config = yaml.safe_load((DEPLOY_SCRIPT.parent / "deploy_local.yaml").read_text())
    # a deployment evaluates federated by default (evaluation=auto): only statistics go up
    assert deployed["config"]["evaluation"] == "auto"
    local = run({**config, "evaluation": "federated"})
    for scope in ("global", "clients", "clients_mean"):
        assert close(local.final[scope], deployed["final"][scope], 1e-5), scope


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to list processes")
def test_a_stolen_hospital_key_is_a_recorded_event_naming_who_served(tmp_path):
    """A thief with a copy of hospital 0's key connects before hospital 0's own node: Flower
    activates the thief and refuses the hospital ("Failed to activate SuperNode"), and the
    thief serves client 0. The second activation of the key is a warning on the
    SuperLink's console and on the submitter's, an event in results.json naming the key
    and both addresses, and the node record names the address that served client 0."""
    out = tmp_path / "stolen"
    done = _deploy(out, [], STOLEN="1")
    said = _sections(done.stdout, "superlink")
    assert "[code: 2004] Failed to activate SuperNode." in said["supernode0.log"]
    console = said["superlink"].splitlines()
    thief = console[0].removeprefix("SuperLink: node ").split(" ", 1)
    node, thief_address = int(thief[0]), thief[1].removeprefix("(hospital-0) active from ")
    (warning,) = [line for line in console if line.startswith("WARNING: ")]
    deployed = json.loads((out / "results.json").read_text())
    assert deployed["status"] == "complete"
    (event,) = deployed["events"]
    assert event["phase"] == "activation" and event["client"] == "site0"
    assert (event["key"], event["node_id"]) == ("hospital-0", node)
    assert event["active_address"] == thief_address != event["address"]
    assert warning == f"WARNING: {event['error']}"
    assert f"warning: {event['error']}" in done.stderr  # the submitter's console, even -q
    served = deployed["nodes"]["clients"]["site0"]
    assert served == {**served, "node_id": node, "key": "hospital-0", "address": thief_address}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to list processes")
def test_loopback_deployment_with_a_slow_node_runs_fedbuff_without_waiting_for_it(tmp_path):
    """Three SuperNodes, one of which sleeps 5 s before each fit. Synchronous rounds wait for
    it; FedBuff keeps the fast nodes training and takes the slow node's updates, stale, when
    they come. Wall times are printed (benchmarks/async_deployment.py measures them), not
    asserted: what is checked is that the fast nodes did not wait. The nodes run with the
    fast layer (warm SuperNodes, flower.fast)."""
    slow = ["--plugin", "test-faults", "--set", "test-faults.slow=[site2:5]"]
    slow += ["--set", "flower.fast=true"]
    slow += ["--rounds", "3", "--set", "eval_every=3"]
    results = {}
    for mode in ("sync", "fedbuff"):
        out = tmp_path / mode
        _deploy(out, [*slow, "--set", f"aggregation={mode}"], SUPERNODE_ARGS="--warm")
        results[mode] = json.loads((out / "results.json").read_text())
    sync, buffered = results["sync"], results["fedbuff"]
    assert sync["status"] == buffered["status"] == "complete"
    assert all(r["sampled"] == ["site0", "site1", "site2"] for r in sync["rounds"])
    updates = [u for r in buffered["rounds"] for u in r["updates"]]
    assert len(updates) == 9 and all(r["server_updates"] == 1 for r in buffered["rounds"])
    fast = [u for u in updates if u["client"] != "site2"]
    assert len(fast) >= 7  # the fast nodes trained on while the slow one slept
    assert "simulated_seconds" not in buffered["final"]  # deployed: real time only
    walls = {mode: sum(r["seconds"] for r in res["rounds"]) for mode, res in results.items()}
    print(f"rounds' wall seconds with one node 5 s slower per fit: {walls}")


@pytest.mark.slow
def test_supernodes_receive_no_statistics_of_other_clients(monkeypatch):
    """Every message a SuperNode receives is inspected: the task description names the
    clients but carries no sizes or class counts; the class counts clients send up for the
    shot groups never go down; the server sees them only as the opted-in setup reply."""
    from fedkit_core.engines.flower import serverapp

    down, up = [], []
    original_to, original_from = serverapp.to_records, serverapp.from_records

    def sending(message):
        down.append(message)
        return original_to(message)

    def receiving(content, kind):
        message = original_from(content, kind)
        up.append(message)
        return message

    monkeypatch.setattr(serverapp, "to_records", sending)
    monkeypatch.setattr(serverapp, "from_records", receiving)
    run(flower(tiny(rounds=1, task={"shot_thresholds": [20, 8]})))
    assert {m.kind for m in down} >= {"describe", "setup", "fit", "evaluate"}
    for message in down:
        text = json.dumps(message.scalars, default=str)
        assert "class_counts" not in text and "num_train" not in text, message.kind
        assert not any("class_counts" in name for name in message.arrays), message.kind
    setup = [m for m in down if m.kind == "setup"]
    task = json.loads(setup[0].scalars["fedkit.task"])
    assert set(task["client_ids"]) == {"site0", "site1", "site2"}
    described = [m for m in up if m.kind == "describe"]
    assert all(set(m.scalars) == {"client_id", "index", "task"} for m in described)
    counts = [m.arrays["class_counts"] for m in up if m.kind == "setup"]
    assert len(counts) == 3  # only because task.shot_thresholds asked for them
