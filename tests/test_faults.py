"""Faults (issue 18): a tolerated client failing mid-round keeps no half-trained state (the
local engine then agrees with Flower, whose node context keeps its last state), and every
client failing is a clear error even when ``min_clients=0`` tolerates any number."""

import ctypes
import faulthandler
import os
import re
import signal
import sys
import time

import pytest

from fedkit_core import FedkitError, hookimpl, run
from fedkit_core.errors import ClientFailure
from fedkit_core.testing import tiny


class MidRound:
    """site1 fails after its first training batch of round 1; every client counts its fits
    in its plugin state and keeps a private running sum of its head weights."""

    @hookimpl
    def fedkit_round_start(self, client):
        client.state["fits"] = client.state.get("fits", 0) + 1
        client.state["batches"] = 0

    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        client.state["batches"] += 1
        if client.id == "site1" and client.round == 1 and client.state["batches"] == 2:
            raise FedkitError("site1 lost its connection")
        return {}

    @hookimpl
    def fedkit_client_report(self, client):
        return {"mid.fits": client.state["fits"]}


@pytest.mark.slow
def test_a_client_failing_mid_round_keeps_no_half_trained_state():
    config = tiny(rounds=2, min_clients=1, keep_optimizer_state=True)
    local = run(config, plugins={"mid": MidRound()})
    assert [e["client"] for e in local["events"]] == ["site1"]
    # round 1 never happened for site1: its state is the one before it, as on Flower
    assert local.rounds[1]["train"]["site1"]["mid.fits"] == 1
    assert local.rounds[1]["train"]["site0"]["mid.fits"] == 2
    pytest.importorskip("flwr")
    flower = {**config, "engine": "flower", "flower": {"backend": "thread"}}
    other = run(flower, plugins={"mid": MidRound()})
    assert other["events"] == local["events"]
    assert other.rounds[1]["train"] == local.rounds[1]["train"]
    for scope in ("global", "clients"):
        assert _close(other.final[scope], local.final[scope]), scope


def _close(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return abs(a - b) < 1e-6
    return a == b


class AllFail:
    def __init__(self, error):
        self.error = error

    @hookimpl
    def fedkit_round_start(self, client):
        raise self.error


@pytest.mark.parametrize(
    "error, kind, code",
    [(FedkitError("no data today"), FedkitError, 2), (ZeroDivisionError("x"), ClientFailure, 1)],
)
def test_every_client_failing_is_a_clear_error_even_with_min_clients_0(error, kind, code):
    with pytest.raises(kind, match="no data today|ZeroDivisionError") as err:
        run(tiny(rounds=1, min_clients=0), plugins={"fail": AllFail(error)})
    assert err.value.exit_code == code


# ---------------------------------------------------------------------------- the local engine's
# fault matrix: a client raising, hanging past client_timeout or exiting its process, with and
# without retries (issue 18)

TIMEOUT = 5.0


class Fault:
    """site1's fit in round 1 raises, hangs or exits its process (``kind``; None: no fault);
    with ``once``, only its first attempt does (a marker file, seen across processes).
    Every client counts its fits in its plugin state and reports it."""

    def __init__(self, kind=None, once=None):
        self.kind, self.once = kind, once

    @hookimpl
    def fedkit_round_start(self, client):
        client.state["fits"] = client.state.get("fits", 0) + 1
        if self.kind is None or client.id != "site1" or client.round != 1:
            return
        if self.once is not None:
            if self.once.exists():
                return
            self.once.touch()
        if self.kind == "raise":
            raise RuntimeError("site1 broke")
        if self.kind == "hang":
            time.sleep(10 * TIMEOUT)
        if self.kind == "sys-exit":  # in-process: fails alone, like a raise
            sys.exit(3)
        if self.kind == "segfault":
            faulthandler.disable()  # no traceback dump in the test's output
            # a real invalid read; SIGSEGV's default action even where the caller ignores
            # it (CI shells may start us with SIGSEGV ignored, which a kill() would obey)
            ctypes.CDLL(None).signal(signal.SIGSEGV, 0)  # SIG_DFL, from any thread
            ctypes.string_at(0)
        os._exit(3)

    @hookimpl
    def fedkit_client_report(self, client):
        return {"fault.fits": client.state["fits"]}


ERRORS = {
    "raise": "plugin 'fault' raised RuntimeError: site1 broke",  # the plugin named
    "hang": rf"no reply within {TIMEOUT:g} s \(client_timeout\)",
    "exit": r"the client's process exited \(exit code 3\)",
    "segfault": "the client's process was killed by SIGSEGV",
    "sys-exit": r"the client exited \(3\)",
}


def _faulty(kind, **overrides):
    """A run that survives one failed client; a hang needs client_timeout, an exit a worker
    process (a raise runs in this process)."""
    config = tiny(**{"rounds": 2, "min_clients": 2, **overrides})
    if kind == "hang":
        config["client_timeout"] = TIMEOUT
    if kind in ("exit", "segfault"):
        config["local"] = {"workers": 1}
    return config


@pytest.fixture(scope="module")
def clean():
    return run(tiny(rounds=2), plugins={"fault": Fault()})


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, engine",
    [
        ("raise", "local"),
        ("hang", "local"),
        ("exit", "local"),
        ("segfault", "local"),
        ("sys-exit", "local"),
        ("sys-exit", "flower"),  # thread backend: the same semantics
    ],
)
def test_a_failed_client_fails_for_its_round_and_comes_back(kind, engine):
    config = _faulty(kind)
    if engine == "flower":
        config |= {"engine": "flower", "flower": {"backend": "thread"}}
    results = run(config, plugins={"fault": Fault(kind)})
    [event] = results["events"]
    assert (event["round"], event["phase"], event["client"]) == (1, "fit", "site1")
    assert re.fullmatch(ERRORS[kind], event["error"])
    assert set(results.rounds[0]["train"]) == {"site0", "site2"}
    # its failed fit left no trace: its state is the one before it
    assert results.rounds[1]["train"]["site1"]["fault.fits"] == 1
    assert results.rounds[1]["train"]["site0"]["fault.fits"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["raise", "hang", "exit"])
def test_a_fault_of_the_first_attempt_is_healed_by_a_retry(kind, clean, tmp_path):
    fault = Fault(kind, once=tmp_path / "failed-once")
    results = run(_faulty(kind, client_retries=1), plugins={"fault": fault})
    assert fault.once.exists()  # the first attempt did fail
    assert results["events"] == []
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in results.rounds]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in clean.rounds]
    for scope in ("global", "clients", "fairness"):
        assert results.final[scope] == clean.final[scope]


def test_too_few_clients_left_after_the_retries_is_a_clear_error():
    config = _faulty("exit", min_clients=3, client_retries=1)
    with pytest.raises(ClientFailure) as err:
        run(config, plugins={"fault": Fault("exit")})
    assert str(err.value) == (
        "client 'site1' failed in round 1: the client's process exited (exit code 3) "
        "(failed 2 attempts)"
    )
    assert err.value.exit_code == 2


@pytest.mark.slow
def test_a_new_worker_rebuilds_its_clients_from_their_checkpoint_folders(clean, tmp_path):
    """With checkpoints, workers ship back only where their clients' snapshots are."""
    fault = Fault("exit", once=tmp_path / "failed-once")
    config = _faulty("exit", client_retries=1, checkpoint=True)
    results = run(config, plugins={"fault": fault}, out=tmp_path / "run")
    assert fault.once.exists() and results["events"] == []
    assert results.rounds[1]["train"] == clean.rounds[1]["train"]
    assert results.final["global"] == clean.final["global"]
