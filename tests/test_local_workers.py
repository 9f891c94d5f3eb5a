"""Clients in worker processes (``local.workers``, issue 16): the same results as clients in
the engine's process, bit for bit, with private state and plugin state living in the workers,
checkpoints written there, and ``fedkit resume`` continuing such a run exactly."""

import json

import pytest
import torch
import yaml

from fedkit_core import FedkitError, hookimpl, resume, run
from fedkit_core.engines.workers import auto_workers, parse_workers
from fedkit_core.testing import tiny


class Tally:
    """Plugin state across rounds: fits counted, a running sum of the logits' bias, and a
    draw from the client's random stream, all reported (so any mix-up between processes or
    clients shows in the results)."""

    @hookimpl
    def fedkit_round_start(self, client):
        state = client.state
        state["fits"] = state.get("fits", 0) + 1
        bias = next(p for n, p in client.model.named_parameters() if n.endswith("bias"))
        state["sum"] = state.get("sum", torch.zeros(())) + bias.detach().sum()
        state["draw"] = float(torch.rand((), generator=client.rng))

    @hookimpl
    def fedkit_client_report(self, client):
        return {f"tally.{k}": float(v) for k, v in client.state.items()}


def _same(a, b):
    """Results equal bit for bit, timings aside."""
    assert [_untimed(r) for r in a.rounds] == [_untimed(r) for r in b.rounds]
    assert {k: v for k, v in a.final.items() if k != "wall_seconds"} == {
        k: v for k, v in b.final.items() if k != "wall_seconds"
    }
    assert a["events"] == b["events"]


def _untimed(record):
    return {k: v for k, v in record.items() if k != "seconds"}


CONFIG = tiny(rounds=3, plugins=["fca"], sample_fraction=0.67, keep_optimizer_state=True)


@pytest.fixture(scope="module")
def serial():
    return run({**CONFIG, "local": {"workers": 0}}, plugins={"tally": Tally()})


@pytest.mark.slow
@pytest.mark.parametrize("tolerant", [False, True])
def test_two_workers_give_the_serial_results_bit_for_bit(serial, tolerant):
    config = {**CONFIG, "local": {"workers": 2}}
    if tolerant:  # snapshots shipped back to the engine after every state change
        config["min_clients"] = 1
    _same(run(config, plugins={"tally": Tally()}), serial)


@pytest.mark.slow
def test_workers_with_fewer_threads_equal_serial_clients_with_as_few():
    """torch's CPU kernels may sum in an order that depends on the thread count, so
    ``local.threads`` below the engine process's threads is the serial run at that count."""
    config = tiny(rounds=2, local={"workers": 2, "threads": 1})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = run(tiny(rounds=2, local={"workers": 0}))
    finally:
        torch.set_num_threads(threads)
    _same(run(config), one)


@pytest.mark.slow
def test_a_run_in_workers_checkpoints_and_resumes_exactly(serial, tmp_path):
    out = tmp_path / "run"
    config = {**CONFIG, "rounds": 2, "checkpoint": True, "local": {"workers": 2}}
    run(config, plugins={"tally": Tally()}, out=out)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump({**saved, "rounds": 3}))
    results = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**results, "status": "running"}))
    resumed = resume(out, plugins={"tally": Tally()})
    assert resumed.final["global"] == serial.final["global"]
    assert resumed.rounds[-1]["train"] == serial.rounds[-1]["train"]


def test_workers_setting():
    assert parse_workers("auto") is None and parse_workers(3) == 3 and parse_workers("0") == 0
    for bad in ("-1", "many", 1.5):
        with pytest.raises(FedkitError, match="local.workers"):
            parse_workers(bad)
    cpu = torch.device("cpu")
    assert auto_workers(sampled=10, cores=2, threads=2, device=cpu) == 0  # 2 cores: serial
    assert auto_workers(sampled=10, cores=2, threads=1, device=cpu) == 0
    assert auto_workers(sampled=10, cores=4, threads=1, device=cpu) == 4
    assert auto_workers(sampled=10, cores=4, threads=1, device=cpu, objects=True) == 0
    assert auto_workers(sampled=10, cores=16, threads=2, device=cpu) == 8
    assert auto_workers(sampled=3, cores=16, threads=2, device=cpu) == 3
    assert auto_workers(sampled=1, cores=16, threads=2, device=cpu) == 0
    assert auto_workers(sampled=10, cores=16, threads=2, device=torch.device("meta")) == 0


def test_a_bad_workers_value_is_refused_before_any_data_is_loaded():
    with pytest.raises(FedkitError, match="local.workers"):
        run(tiny(local={"workers": "lots"}))
