"""Atomic file writing, the one way fedkit writes a file: a reader never sees a half-written
file, and a writer killed mid-write leaves only a temporary file that the next writer of
the same file removes.

Written files get the mode ``open()`` would give (0666 less the umask) less what their
folder denies others, and new folders their parent's mode, so a private folder's files stay
private (docs/architecture.md, "Files and who may read them").
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import re
import socket
import stat
import tempfile
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: permission bits of written files: 0666 less the umask, as open() would give (mkstemp's
#: temporary file is 0600, which would hide shared caches and results from colleagues)
FILE_MODE = 0o666 & ~_umask()


def file_mode(folder: Path) -> int:
    """Permission bits of a file fedkit writes in ``folder``: what ``open()`` gives
    (:data:`FILE_MODE`, 0666 less the umask), less what the folder denies its group and
    others, so that a private folder (0700) holds private files (0600). The owner may
    always read and write."""
    try:
        allowed = stat.S_IMODE(folder.stat().st_mode) | 0o600
    except OSError:
        return FILE_MODE
    return FILE_MODE & allowed & 0o666


def make_folder(folder: Path) -> None:
    """Make ``folder`` and its missing parents, each as open to others as the folder it is
    made in (the umask applied): a private run's subfolders are private."""
    folder = Path(folder)
    if folder.is_dir():
        return
    make_folder(folder.parent)
    try:
        folder.mkdir(mode=stat.S_IMODE(folder.parent.stat().st_mode) & 0o777)  # no sticky bit
    except FileExistsError:
        if not folder.is_dir():
            raise


#: this host's mark in the names of temporary files (beside the writer's process id)
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _remove_dead_writers(path: Path) -> None:
    """Delete the temporary files of writers of ``path`` that were killed mid-write (an
    interrupted ``fedkit report``, say): ``.NAME._HOST-PID-XXXX.tmp`` of this host whose
    process is gone. A live writer's file, or another host's, is left alone."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{_HOST}-(\d+)-[^/]*\.tmp")
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.{_HOST}-*.tmp"):
        found = pattern.fullmatch(tmp.name)
        if found and not process_alive(int(found.group(1))):
            tmp.unlink(missing_ok=True)


def write_atomic(path: Path, write: Callable[[IO[bytes]], None], mode: int | None = None) -> None:
    """Write ``path`` through a temporary file renamed over it; ``mode``: its permission
    bits (default: :func:`file_mode` of its folder)."""
    make_folder(path.parent)
    mode = file_mode(path.parent) if mode is None else mode
    _remove_dead_writers(path)
    prefix = f".{path.name}.{_HOST}-{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        if err.filename is None:  # a write's error names no file: name the one written
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_atomic(Path(path), lambda fh: fh.write(text.encode()))


def write_torch(path: Path, obj: Any, mode: int | None = None) -> None:
    """Save ``obj`` atomically; ``mode``: the file's permission bits (default: as
    :func:`file_mode` of its folder)."""
    import torch

    try:  # unbuffered: a full disk raises its OSError inside torch.save, which passes it on
        write_atomic(Path(path), lambda fh: torch.save(obj, fh.raw), mode)
    except RuntimeError as err:  # torch's own failures of the writer
        if "unexpected pos" in str(err):  # its zip writer after a short write: a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
        raise OSError(
            errno.EIO, f"could not write ({str(err)[:200]}); is the disk full?", str(path)
        ) from err


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is running (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


#: the longest file or folder name fedkit makes from a user's text, in UTF-8 bytes: file
#: systems allow 255, and a temporary file beside it (:func:`write_atomic`) adds ~30 more
MAX_NAME_BYTES = 100


def folder_name(text: str, limit: int = MAX_NAME_BYTES) -> str:
    """``text`` as the name of one file or folder inside another, readable in any script:
    letters, marks and digits of every alphabet stay (``病院A``), other characters but
    ``_.+-`` become ``_`` (no path separators), a name of dots alone (``.``, ``..``) has its
    dots replaced too, so that a name never leads out of its folder; a name longer than
    ``limit`` UTF-8 bytes is cut, on a whole character, and ends with ``-`` and 8 hex digits
    of the whole text's digest, so that two long names stay apart."""
    text = unicodedata.normalize("NFC", text)
    kept = "".join(c if c in "_.+-" or unicodedata.category(c)[0] in "LMN" else "\0" for c in text)
    name = re.sub("\0+", "_", kept)
    name = name if name.strip(".") else name.replace(".", "_") or "_"
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    cut = name.encode()[: limit - len(digest) - 1].decode(errors="ignore")
    return f"{cut}-{digest}"
