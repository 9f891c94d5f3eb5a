"""examples/flower/deploy_local.sh runs the Python that fedkit was installed with, says which,
and stops with a clear error when that Python lacks fedkit or Flower (``--dry-run``: the
choice and the check alone, nothing started)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "flower" / "deploy_local.sh"
#: PATH without any venv: the system's tools only
SYSTEM_PATH = "/usr/bin:/bin"
needs_flower = pytest.mark.skipif(
    importlib.util.find_spec("flwr") is None, reason="needs fedkit[flower]"
)


def wrapper(path: Path, *flags: str) -> Path:
    """An executable ``path`` running this test's Python (with ``flags``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {" ".join(flags)} "$@"\n')
    path.chmod(0o755)
    return path


def dry_run(script: Path = SCRIPT, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "PATH")}
    return subprocess.run(
        ["bash", str(script), "--dry-run"],
        env={**base, "PATH": SYSTEM_PATH, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_flower
def test_the_active_venv_comes_first(tmp_path):
    python = wrapper(tmp_path / "venv" / "bin" / "python")
    done = dry_run(VIRTUAL_ENV=str(tmp_path / "venv"))
    assert done.returncode == 0, done.stderr
    assert f"Python {python} (the active venv, VIRTUAL_ENV)" in done.stderr


@needs_flower
def test_else_the_python_of_the_fedkit_command_on_path(tmp_path):
    python = wrapper(tmp_path / "env" / "python3.11")
    fedkit = tmp_path / "bin" / "fedkit"
    fedkit.parent.mkdir()
    fedkit.write_text(f"#!{python}\nfrom fedkit_core.cli import main\n")
    fedkit.chmod(0o755)
    done = dry_run(PATH=f"{fedkit.parent}:{SYSTEM_PATH}")
    assert done.returncode == 0, done.stderr
    assert f"Python {python} (the fedkit command at {fedkit})" in done.stderr


@needs_flower
def test_else_the_checkouts_venv(tmp_path):
    script = tmp_path / "examples" / "flower" / "deploy_local.sh"
    script.parent.mkdir(parents=True)
    shutil.copy(SCRIPT, script)
    python = wrapper(tmp_path / ".venv" / "bin" / "python")
    done = dry_run(script)
    assert done.returncode == 0, done.stderr
    assert f"Python {python} (the checkout's .venv)" in done.stderr


def test_a_python_without_flower_is_a_clear_error(tmp_path):
    bare = wrapper(tmp_path / "bare" / "python", "-I", "-S")  # no site-packages, no PYTHONPATH
    done = dry_run(PYTHON=str(bare))
    assert done.returncode == 2
    assert f"error: {bare} lacks fedkit_core flwr tomli_w" in done.stderr
    assert "pip install 'fedkit[flower]'" in done.stderr and "Traceback" not in done.stderr


def test_without_an_output_folder_it_prints_its_usage():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage:" in done.stderr
