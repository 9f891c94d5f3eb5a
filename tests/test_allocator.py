"""keep_freed_memory: a training step's allocations reuse freed memory instead of being mapped
afresh (and page-faulted) every step. Each case runs in a fresh interpreter: malloc settings
are per process, and the test process's own must stay as they are."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedkit_core.allocator import USER_SETTINGS, on_glibc

pytestmark = pytest.mark.skipif(not on_glibc(), reason="glibc's malloc settings (Linux)")

#: a step's worth of activations (MiB) allocated, then freed, 20 times; prints the process's
#: minor page faults over the loop
STEPS = """
import sys
from fedkit_core.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults():
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])
before = faults()
for _ in range(20):
    held = [bytearray(mib << 20) for mib in (6, 6, 2, 3, 3, 1)]
    del held
print(kept, faults() - before)
"""


def steps(mode: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_memory_is_reused_instead_of_faulted_in_again():
    _, default = steps("default")
    kept, faults = steps("keep")
    assert kept == "True"
    # 20 steps of 21 MiB are ~107,000 pages: by default glibc maps and trims most of them
    # again every step; kept, only the first step touches new pages (5,376 of them)
    assert default > 40_000
    assert faults < default / 5


def test_a_users_own_malloc_settings_are_left_alone():
    kept, _ = steps("keep", MALLOC_TRIM_THRESHOLD_="1000000")
    assert kept == "False"
