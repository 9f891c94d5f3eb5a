"""Digests of a data folder's files, for the task cache's key (see :mod:`.cache`).

A cache keyed on a file's path, size and modification time reuses stale arrays once a file
is rewritten with the same size and mtime (``cp -p``, ``rsync -t``, a re-extracted
archive). The key therefore holds a digest of every file's bytes (BLAKE2b, fast in C),
computed once: each is kept in a memo beside the cache entries with the file's size,
mtime, ctime and inode, and read again only when one of these changed. The ctime (change
time) is set by the kernel on every write or rename and cannot be set back by tools that
restore mtimes, so rechecking a folder costs one ``stat`` per file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from fedkit_core.fileio import write_atomic

#: bytes read at a time while digesting a file
CHUNK = 1 << 20


def digest_file(path: Path) -> str:
    """The BLAKE2b digest of the bytes of ``path``."""
    digest = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: Path) -> list[int]:
    """What changes whenever the file's bytes may have: size, mtime, ctime, inode."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def file_digests(
    files: Iterable[Path], memo: Path | None, mode: int | None = None
) -> dict[str, str]:
    """``{path: digest of its bytes}`` of ``files``; digests whose file has the stamp kept
    in ``memo`` (a JSON file; ``None``: none) are taken from it, the others computed and
    the memo rewritten with permission bits ``mode`` (a memo that cannot be written only
    costs the next run a re-read)."""
    known: dict = {}
    if memo is not None:
        try:
            known = json.loads(memo.read_text())
        except (OSError, ValueError):
            known = {}
        if not isinstance(known, dict):
            known = {}
    out: dict[str, str] = {}
    fresh: dict[str, list] = {}
    for path in files:
        key = str(path)
        stamp = _stamp(path)
        entry = known.get(key)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stamp:
            out[key] = str(entry[1])
        else:
            out[key] = digest_file(path)
        fresh[key] = [stamp, out[key]]
    if memo is not None and fresh != known:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(memo, lambda fh: fh.write(json.dumps(fresh).encode()), mode)
        except OSError:
            pass
    return out
