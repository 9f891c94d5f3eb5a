"""A SCAFFOLD or FedAdam run killed with SIGKILL resumes to an uninterrupted run's results:
the server's state (SCAFFOLD's variate ``c``, FedAdam's moments) and the clients' (each
``c_i``) come back from the checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedkit_core.testing import tiny

pytestmark = pytest.mark.slow

FEDKIT = [sys.executable, "-m", "fedkit_core.cli"]
#: enough rounds that the run is still going when it is killed after its second
ROUNDS = 6


def _run_until_checkpoint(config: Path, out: Path, rounds: int) -> subprocess.Popen:
    """A `fedkit run` in its own process group, returned once ``rounds`` are checkpointed."""
    proc = subprocess.Popen(
        [*FEDKIT, "run", "--config", str(config), "--out", str(out), "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    manifest = out / "checkpoint" / "latest.json"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if manifest.is_file() and json.loads(manifest.read_text())["round"] >= rounds:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["scaffold", "fedadam"])
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, plugin):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=ROUNDS, checkpoint=True, plugins=[plugin])))
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    proc = _run_until_checkpoint(config, killed, 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = json.loads((killed / "results.json").read_text())
    assert done["status"] == "running" and len(done["rounds"]) < ROUNDS
    subprocess.run([*FEDKIT, "resume", str(killed), "-q"], check=True, capture_output=True)
    subprocess.run(
        [*FEDKIT, "run", "--config", str(config), "--out", str(straight), "-q"],
        check=True,
        capture_output=True,
    )
    a = json.loads((killed / "results.json").read_text())
    b = json.loads((straight / "results.json").read_text())
    assert a["status"] == "complete" and len(a["rounds"]) == ROUNDS
    for key in ("global", "clients", "clients_mean", "fairness", "best"):
        assert a["final"][key] == b["final"][key], key
    for mine, theirs in zip(a["rounds"], b["rounds"], strict=True):
        assert mine["train"] == theirs["train"]
