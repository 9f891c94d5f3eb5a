"""Trustworthy re-runs: a run folder records the hash of its config and is reused only for that
config (``compare`` and ``run --out`` refuse a run of another config, naming the differing
keys); compare.json describes exactly the runs of its command; ``run.lock`` keeps a second
process from writing a run, and a lock left by a dead process is taken over."""

import json
import socket
import subprocess
import sys

import pytest

from fedkit_core import FedkitError, resume, run
from fedkit_core.comparison import compare
from fedkit_core.results.compare import RESERVED
from fedkit_core.results.store import RunDir, config_hash
from fedkit_core.testing import tiny


def _compare(out, specs=("fedavg",), **sets):
    return compare(list(specs), seeds=[0], out=out, base=[tiny(rounds=1)], sets=sets)


@pytest.mark.slow
def test_compare_refuses_a_folder_holding_another_config(tmp_path):
    _compare(tmp_path)
    seed0 = tmp_path / "fedavg" / "seed0"
    before = (seed0 / "results.json").read_text()
    with pytest.raises(FedkitError) as err:
        _compare(tmp_path, ("fedavg", "fca"), lr=0.01, rounds=2)
    assert str(seed0) in str(err.value)
    assert "lr: 0.001 -> 0.01; rounds: 1 -> 2" in str(err.value)
    assert (seed0 / "results.json").read_text() == before  # neither reused nor overwritten
    assert not (tmp_path / "fca").exists()  # refused before anything ran


@pytest.mark.slow
def test_compare_reuses_a_run_of_the_same_config(tmp_path):
    first = _compare(tmp_path)
    seed0 = RunDir(tmp_path / "fedavg" / "seed0")
    assert seed0.config_sha256.read_text().strip() == config_hash(seed0.load_config())
    stamp = seed0.results.stat().st_mtime_ns
    again = _compare(tmp_path)
    assert seed0.results.stat().st_mtime_ns == stamp
    assert again.table == first.table


def test_the_hash_ignores_the_run_name_only():
    config = {"name": "a", "lr": 0.001, "task": {"name": "synthetic"}}
    assert config_hash(config) == config_hash({**config, "name": "b"})
    assert config_hash(config) != config_hash({**config, "lr": 0.01})


@pytest.mark.slow
def test_compare_summary_never_outlives_its_command(tmp_path):
    def compared():
        return set(json.loads((tmp_path / "compare.json").read_text())) - set(RESERVED)

    _compare(tmp_path, ("fedavg", "fca"))
    assert compared() == {"fedavg", "fca"}
    _compare(tmp_path, ("fca",))
    assert compared() == {"fca"}

    def broken(layers, path, spec, seed):
        raise FedkitError("the run failed")

    with pytest.raises(FedkitError):
        compare(["fedavg"], seeds=[0], out=tmp_path, base=[tiny(rounds=1)], run_one=broken)
    assert not list(tmp_path.glob("compare.*"))  # no summary of the earlier command is left


@pytest.mark.slow
def test_run_out_refuses_a_folder_holding_another_config(tmp_path):
    run(tiny(rounds=1), out=tmp_path / "r")
    with pytest.raises(FedkitError, match=r"another config \(lr: 0.001 -> 0.01\)"):
        run(tiny(rounds=1, lr=0.01), out=tmp_path / "r")
    with pytest.raises(FedkitError, match="already holds a run of this config"):
        run(tiny(rounds=1), out=tmp_path / "r")


@pytest.fixture
def done(tmp_path):
    out = tmp_path / "run"
    run(tiny(rounds=1, checkpoint=True), out=out)
    return out


def _lock(out, pid, host=None):
    lock = {"pid": pid, "host": host or socket.gethostname(), "since": "then"}
    (out / "run.lock").write_text(json.dumps(lock))


@pytest.mark.slow
def test_a_run_being_written_is_refused_and_a_dead_writers_lock_taken_over(done):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock(done, child.pid)
        (done / "results.json").unlink()  # unfinished: reusing it means writing it
        for again in (
            lambda: resume(done),
            lambda: run(tiny(rounds=1, checkpoint=True), out=done, reuse=True),
        ):
            with pytest.raises(FedkitError, match=f"being written by process {child.pid} "):
                again()
    finally:
        child.kill()
        child.wait()
    assert resume(done).final  # the dead process's lock is stale: taken over
    assert not (done / "run.lock").exists()  # and released


def test_a_lock_from_another_host_is_never_taken_over(done):
    _lock(done, 999_999_999, host="elsewhere")
    with pytest.raises(FedkitError, match="process 999999999 on host elsewhere.*delete"):
        resume(done)
    assert (done / "run.lock").exists()


def test_a_run_holds_its_lock_while_it_is_written(tmp_path):
    from fedkit_core.contract.observer import Observer

    seen = []

    class Watch(Observer):
        def on_round_end(self, record):
            seen.append(json.loads((tmp_path / "r" / "run.lock").read_text())["pid"])

    run(tiny(rounds=2), out=tmp_path / "r", observer=Watch())
    assert len(seen) == 2 and len(set(seen)) == 1
    assert not (tmp_path / "r" / "run.lock").exists()


def test_a_run_made_before_an_option_existed_is_reused_while_the_option_is_at_its_default(
    tmp_path,
):
    out = tmp_path / "r"
    first = run(tiny(rounds=1), out=out)
    run_dir = RunDir(out)
    older = run_dir.load_config()
    del older["bn"]  # as written by a fedkit without the `bn` option
    run_dir.save_config(older)
    stamp = run_dir.results.stat().st_mtime_ns
    again = run(tiny(rounds=1), out=out, reuse=True)  # bn=average: what it did before
    assert again.final == first.final and run_dir.results.stat().st_mtime_ns == stamp
    with pytest.raises(FedkitError, match=r"another config \(bn: - -> local\)"):
        run(tiny(rounds=1, bn="local"), out=out, reuse=True)
