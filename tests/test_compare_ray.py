"""``fedkit compare --executor ray``: each run a task on a Ray cluster gives the very runs
``--jobs`` gives, and a bad executor or address is one clear error (exit 2)."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedkit_core import FedkitError
from fedkit_core.cli import main
from fedkit_core.comparison import compare, executor_for
from fedkit_core.parallel import LocalProcesses
from fedkit_core.testing import tiny

#: the process groups of this module's Ray cluster (its head's and its worker node's daemons)
_GROUPS: list[int] = []
RAY = [sys.executable, "-m", "ray.scripts.scripts", "start", "--disable-usage-stats"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(groups: list[int]) -> None:
    """Stop the Ray processes of these process groups (each ``ray start``'s daemons keep its
    group), and no other Ray on the machine (``ray stop`` would stop every Ray of this user)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
        time.sleep(2)


@pytest.fixture(scope="module")
def cluster():
    """A two-node Ray cluster on loopback only: a head and one worker node, 1 CPU each. Ray
    rewrites the address 127.0.0.1 to this machine's network address, so the nodes take
    127.0.0.2 and 127.0.0.3 (loopback too, on Linux)."""
    temp = Path(tempfile.mkdtemp(prefix="fkray-", dir="/tmp"))  # short: Ray's socket paths
    port, groups = _free_port(), _GROUPS
    head = ["--head", "--node-ip-address=127.0.0.2", f"--port={port}", "--num-cpus=1"]
    head += ["--include-dashboard=false", f"--temp-dir={temp}"]
    worker = [f"--address=127.0.0.2:{port}", "--node-ip-address=127.0.0.3", "--num-cpus=1"]
    try:
        for args in (head, worker):
            start = subprocess.Popen(
                [*RAY, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # its own process group, stopped by _stop
            )
            groups.append(start.pid)
            output, _ = start.communicate(timeout=180)
            assert start.returncode == 0, output
        yield f"127.0.0.2:{port}"
    finally:
        _stop(groups)
        shutil.rmtree(temp, ignore_errors=True)


def _rounds(path):
    records = json.loads(path.read_text())["rounds"]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def _scores(table):
    return {
        spec: {metric: v for metric, v in metrics.items() if "seconds" not in metric}
        for spec, metrics in table.items()
    }


@pytest.mark.slow
def test_runs_on_a_ray_cluster_equal_the_jobs_2_runs(tmp_path, cluster):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=2)))
    specs, seeds = ["fedavg", "fca"], [0, 1]
    command = [sys.executable, "-m", "fedkit_core.cli", "compare", *specs, "--seeds", "0,1"]
    command += ["--config", str(config), "--out", str(tmp_path / "ray")]
    command += ["--executor", "ray", "--address", cluster]
    ray = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert ray.returncode == 0, ray.stdout + ray.stderr
    for spec in specs:  # progress: a line per finished run
        for seed in seeds:
            assert f"{spec} seed {seed} done" in ray.stdout
    local = compare(
        specs, seeds=seeds, out=tmp_path / "jobs", base=[tiny(rounds=2)], executor=LocalProcesses(2)
    )
    found = json.loads((tmp_path / "ray" / "compare.json").read_text())
    assert _scores({s: found[s] for s in specs}) == _scores(local.table)
    for spec in specs:
        for seed in seeds:
            run = f"{spec}/seed{seed}/results.json"
            assert _rounds(tmp_path / "ray" / run) == _rounds(tmp_path / "jobs" / run)


def _task_workers() -> list[int]:
    """The pids of this cluster's worker processes running a run (Ray titles them by task)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0]
            if title.startswith(b"ray::_run_task") and os.getpgid(int(proc.name)) in _GROUPS:
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.slow
def test_a_run_whose_worker_is_lost_continues_from_its_checkpoint(tmp_path, cluster):
    config = tiny(rounds=8, checkpoint=True)
    config["task"]["head_samples"] = 96  # rounds long enough to be caught mid-run
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "fedkit_core.cli", "compare", "fedavg", "--seeds", "0"]
    command += ["--config", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "ray")]
    command += ["--executor", "ray", "--address", cluster]
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    results = tmp_path / "ray" / "fedavg" / "seed0" / "results.json"
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and running.poll() is None and time.monotonic() < deadline:
        done = json.loads(results.read_text())["rounds"] if results.is_file() else []
        workers = _task_workers()
        if 1 <= len(done) < 6 and workers:
            os.kill(workers[0], signal.SIGKILL)  # the run's worker process is lost
            killed = len(done)
        time.sleep(0.1)
    output, _ = running.communicate(timeout=600)
    assert killed is not None, "the run finished before its worker could be killed"
    assert running.returncode == 0, output
    found = json.loads(results.read_text())
    assert found["status"] == "complete"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the Ray task: a thread per CPU it holds
    try:
        compare(["fedavg"], seeds=[0], out=tmp_path / "here", base=[config])
    finally:
        torch.set_num_threads(threads)
    assert _rounds(results) == _rounds(tmp_path / "here" / "fedavg" / "seed0" / "results.json")


def test_an_unknown_executor_is_exit_2(tmp_path, capsys):
    assert main(["compare", "fedavg", "--executor", "slurm", "--out", str(tmp_path)]) == 2
    assert "--executor must be local or ray, got 'slurm'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "jobs", "address", "message"),
    [
        ("ray", 1, None, "--executor ray needs --address HOST:PORT"),
        ("ray", 1, "nowhere", "--address must be the Ray head's HOST:PORT"),
        ("ray", 2, "127.0.0.1:6379", "--jobs is for --executor local"),
        ("local", 1, "127.0.0.1:6379", "--address names a Ray cluster"),
    ],
)
def test_bad_executor_flags_are_refused(name, jobs, address, message):
    with pytest.raises(FedkitError, match=message):
        executor_for(name, jobs, address)


def test_an_address_where_nothing_answers_is_one_clear_error(tmp_path):
    port = _free_port()  # closed again: nothing listens there
    with pytest.raises(FedkitError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        compare(
            ["fedavg"],
            seeds=[0],
            out=tmp_path,
            base=[tiny(rounds=1)],
            executor=executor_for("ray", 1, f"127.0.0.1:{port}"),
        )
