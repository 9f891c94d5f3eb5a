"""What keying the task cache on content costs: over every file of a data folder, the old
key's ``stat`` of each file (size, mtime) against the first digest of every file's bytes
and the recheck of a later run (one ``stat`` per file against the memo), in one process.

    python benchmarks/file_digests.py ../shared/data/fed_isic2019

The first digest reads every byte: on a cold page cache it costs the disk's read time
(run once after ``echo 3 > /proc/sys/vm/drop_caches`` to see it). Prints seconds and ratios.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from fedkit_core.tasks.digests import file_digests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    files = sorted(p for p in args.path.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    start = time.perf_counter()
    stamps = []
    for path in files:  # the old key: size and mtime of every file
        st = os.stat(path)
        stamps.append((st.st_size, st.st_mtime_ns))
    stat_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        memo = Path(tmp) / "files.json"
        start = time.perf_counter()
        file_digests(files, memo)
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        file_digests(files, memo)
        again_s = time.perf_counter() - start
    print(f"{len(files)} files, {size / 1e6:.1f} MB")
    print(f"stat only (old key):        {stat_s:.3f} s")
    print(f"first digest of the bytes:  {first_s:.3f} s ({first_s / stat_s:.1f}x stat)")
    print(f"recheck against the memo:   {again_s:.3f} s ({again_s / stat_s:.1f}x stat)")


if __name__ == "__main__":
    main()
