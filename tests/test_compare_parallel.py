"""``fedkit compare --jobs``: runs in worker processes give the very runs a serial comparison
gives at the same thread count, and a failing run is one clear error naming it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedkit_core import FedkitError
from fedkit_core.comparison import compare
from fedkit_core.parallel import threads_per_job
from fedkit_core.testing import tiny


def _scores(table):
    """A comparison's table without its timings."""
    return {
        spec: {metric: v for metric, v in metrics.items() if "seconds" not in metric}
        for spec, metrics in table.items()
    }


def _rounds(path):
    records = json.loads(path.read_text())["rounds"]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


@pytest.mark.slow
def test_parallel_runs_equal_serial_runs_at_the_same_thread_count(tmp_path):
    specs, seeds, base = ["fedavg", "fca"], [0, 1], [tiny(rounds=2)]
    finished = []
    parallel = compare(
        specs,
        seeds=seeds,
        out=tmp_path / "parallel",
        base=base,
        jobs=2,
        on_done=lambda spec, seed: finished.append((spec, seed)),
    )
    assert sorted(finished) == [(s, k) for s in sorted(specs) for k in seeds]
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_job(2))
    try:
        serial = compare(specs, seeds=seeds, out=tmp_path / "serial", base=base)
    finally:
        torch.set_num_threads(threads)
    assert _scores(parallel.table) == _scores(serial.table)
    assert _scores(parallel.diff) == _scores(serial.diff)
    for spec in specs:
        for seed in seeds:
            run = f"{spec}/seed{seed}/results.json"
            assert _rounds(tmp_path / "parallel" / run) == _rounds(tmp_path / "serial" / run)


@pytest.mark.slow
def test_a_failing_run_is_one_error_naming_it(tmp_path):
    base = [{"task": {"name": "npz", "path": str(tmp_path / "missing.npz")}, "rounds": 1}]
    # both seeds fail; whichever fails first stops the comparison and is named
    with pytest.raises(FedkitError, match=r"^fedavg seed [01]: .*missing\.npz"):
        compare(["fedavg"], seeds=[0, 1], out=tmp_path / "c", base=base, jobs=2)
    assert not list((tmp_path / "c").glob("compare.*"))


@pytest.mark.parametrize("jobs", [0, -1, 1.5])
def test_jobs_must_be_a_positive_whole_number(tmp_path, jobs):
    with pytest.raises(FedkitError, match="--jobs must be a whole number of at least 1"):
        compare(["fedavg"], seeds=[0], out=tmp_path, base=[tiny(rounds=1)], jobs=jobs)


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_killing_a_parallel_comparison_ends_its_workers_and_resource_tracker(tmp_path):
    """SIGKILL of ``compare --jobs 2`` (no clean-up runs): before, its workers (about 820 MB
    each on MedMNIST) and the resource tracker ran on under PID 1 for minutes."""
    script = (
        "from fedkit_core.comparison import compare\n"
        "from fedkit_core.testing import tiny\n"
        f"compare(['fedavg', 'fedprox'], seeds=[0], out={str(tmp_path / 'cmp')!r}, "
        "base=[tiny(rounds=500)], jobs=2)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    children: set[int] = set()
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list((tmp_path / "cmp").glob("*/seed0/run.lock")):
            time.sleep(0.2)  # the workers are running once their runs hold their locks
        children = _children(parent.pid)
        assert len(children) >= 3  # two workers and the resource tracker
        parent.kill()
        parent.wait()
        deadline = time.time() + 20
        while time.time() < deadline and any(map(_alive, children)):
            time.sleep(0.2)
        assert not [c for c in children if _alive(c)]
    finally:
        parent.kill()
        for child in [c for c in children | _children(parent.pid) if _alive(c)]:
            os.kill(child, signal.SIGKILL)
