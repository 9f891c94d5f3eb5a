"""The README's two set-up lines (`sh install.sh ...`) run as written on a fresh copy of the
repository: one installs fedkit and runs the quick start, one installs the test tools and runs
the tests. They install from the network (pip's cache is reused), so they are slow tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK_START = "sh install.sh && .venv/bin/fedkit run"
TESTS = "sh install.sh --dev && .venv/bin/pytest"


def setup_lines() -> list[str]:
    """The README's lines that start with ``sh install.sh``."""
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^(sh install\.sh.*)$", text, re.M)


def test_the_readme_gives_two_setup_lines():
    assert setup_lines() == [QUICK_START, TESTS]
    text = (ROOT / "install.sh").read_text()
    assert "out of reach: PyTorch from PyPI" in text and "PyTorch's CPU build" in text


def fresh_copy(tmp_path: Path) -> Path:
    """The repository's files (tracked, and new ones git does not ignore) in a new folder."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    repo = tmp_path / "fedkit"
    for name in listed:
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    return repo


def run_line(line: str, repo: Path, timeout: float) -> str:
    """``line`` in ``repo`` as a user's shell runs it, outside this venv; its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        ["sh", "-c", line],
        cwd=repo,
        env={**env, "MPLBACKEND": "Agg"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


def test_ci_runs_the_readme_test_line():
    """CI (.ci/run) installs with the README's test line, so every CI run checks it in full."""
    install, pytest_command = TESTS.split(" && ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{install}\n" in ci and f"\n{pytest_command} " in ci


@pytest.mark.slow
def test_the_quick_start_line_installs_and_runs(tmp_path):
    repo = fresh_copy(tmp_path)
    output = run_line(QUICK_START, repo, timeout=3600)
    assert re.search(
        r"install\.sh: PyTorch('s CPU build| from PyPI|'s index .* out of reach)", output
    )
    (results,) = repo.glob("runs/*/results.json")
    assert json.loads(results.read_text())["status"] == "complete"
    assert results.parent.name.startswith("fedavg-synthetic-cnn-")


@pytest.mark.slow
def test_the_test_line_installs_the_test_tools(tmp_path):
    repo = fresh_copy(tmp_path)
    # the whole suite inside the suite would take it twice: the line as written, with the
    # pytest it ends in given a quick file (the whole suite is what CI runs anyway)
    line = TESTS + " -q -p no:cacheprovider tests/test_config.py"
    output = run_line(line, repo, timeout=3600)
    assert re.search(r"\d+ passed", output) and " failed" not in output
