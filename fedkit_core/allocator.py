"""Host memory between training steps: freed memory kept in the process for the next step.

On Linux with glibc, ``malloc`` hands memory back to the kernel when a large block is freed
(blocks of at least ``M_MMAP_THRESHOLD`` are separate mappings, unmapped on ``free``) and
when the free space at the top of the heap exceeds ``M_TRIM_THRESHOLD``. glibc raises both
thresholds as it sees large blocks freed, so whether a process gets there depends on what it
allocated before. A CPU training step allocates and frees the same activations and
gradients every step (the anchor job's CNN: about 30 MB a step at batch 64); in a process
where the thresholds stayed low, every step maps that memory afresh and the kernel zeroes
it page by page. In a Ray worker of the Flower simulation that cost about 30,000 page faults
and 20-30 % of each client's ``fit`` (0.21 s against 0.15 s, issue 16); the same job in
another process, whose heap happened to be laid out otherwise, had none.

:func:`keep_freed_memory` fixes both thresholds where clients train: blocks below 32 MiB
(glibc's largest mapping threshold) come from the heap, and up to 128 MiB of free heap stay
in the process. Larger blocks are mapped and unmapped as before, and a process keeps at
most that much more resident memory. A process whose environment sets glibc's own malloc
settings (``MALLOC_*_`` variables or ``GLIBC_TUNABLES``) is left as its user tuned it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

#: glibc's ``mallopt`` parameters (``<malloc.h>``)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks below this come from the heap (glibc accepts at most 32 MiB on 64-bit systems)
MMAP_THRESHOLD = 32 * 2**20
#: free space at the top of the heap kept for reuse before it is returned to the kernel
TRIM_THRESHOLD = 128 * 2**20
#: environment variables through which a user sets glibc's malloc parameters
USER_SETTINGS = (
    "GLIBC_TUNABLES",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)


def on_glibc() -> bool:
    """Whether this process runs on Linux with glibc, whose ``malloc`` this module tunes."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@functools.cache
def keep_freed_memory() -> bool:
    """Set this process's malloc thresholds as the module docstring says (once per
    process; forked children inherit them). True when they were set; False on a system
    without glibc or where the environment already sets them."""
    if not on_glibc() or any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
