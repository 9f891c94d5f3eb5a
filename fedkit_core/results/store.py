"""A run directory: its files, written atomically (:mod:`fedkit_core.fileio`).

A run directory records the SHA-256 of its resolved config (``config.sha256``) so that a run
is reused only for the very config it was made with, and holds ``run.lock`` while a process
writes it so that two processes never write one run.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from fedkit_core.config import safe_yaml
from fedkit_core.errors import FedkitError
from fedkit_core.fileio import folder_name, process_alive, write_atomic, write_text
from fedkit_core.results.labels import method_label, setting_parts
from fedkit_core.results.schema import MetricsCsv, PerRound


def _mapping(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise FedkitError(f"{path} is corrupt: it holds a {type(data).__name__}, not a mapping")
    return data


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n")


class ResultsWriter:
    """Writes a running run's results.json and metrics.csv after each round at the cost of
    what changed, not of the whole history: each round's record is serialised once and its
    text kept (see :class:`~fedkit_core.results.schema.PerRound` for when it is serialised
    again), and the files are assembled from the pieces, byte for byte what
    :func:`write_json` and :func:`~fedkit_core.results.schema.metrics_csv` write."""

    def __init__(self) -> None:
        self._rounds = PerRound(lambda record: b"\n    " + _dumps(record, 2))
        self.metrics = MetricsCsv()

    def write(self, run_dir: RunDir, results: Mapping[str, Any]) -> None:
        """Write ``results`` (a mapping with a ``rounds`` list) to ``run_dir``'s
        results.json and metrics.csv, each atomically."""
        self.write_json(run_dir.results, results)
        write_text(run_dir.metrics_csv, self.metrics.text(results["rounds"]))

    def write_json(self, path: Path, results: Mapping[str, Any]) -> None:
        """Write ``results`` to ``path`` atomically, as :func:`write_json` would."""
        parts = self.pieces(results)
        write_atomic(Path(path), lambda fh: fh.writelines(parts))

    def pieces(self, results: Mapping[str, Any]) -> list[bytes]:
        """The bytes of ``json.dumps(results, indent=2) + "\\n"``, in pieces."""
        out = [b"{"]
        for n, (key, value) in enumerate(results.items()):
            out.append(b"%s\n  %s: " % (b"," if n else b"", _dumps(key, 0)))
            out.extend(self._list(value) if key == "rounds" else [_dumps(value, 1)])
        out.append(b"\n}\n" if results else b"}\n")
        return out

    def _list(self, records: list[Mapping[str, Any]]) -> list[bytes]:
        """The pieces of the ``rounds`` list (at nesting level 1)."""
        if not records:
            return [b"[]"]
        out = [b"["]
        for n, text in enumerate(self._rounds(records)):
            out += [b",", text] if n else [text]
        return [*out, b"\n  ]"]


def _dumps(value: Any, level: int) -> bytes:
    """``value`` as :func:`write_json` writes it at nesting ``level`` (two spaces a level;
    JSON text holds no other line breaks: those in strings are escaped)."""
    text = json.dumps(value, indent=2, sort_keys=False, default=_jsonable)
    return text.replace("\n", "\n" + "  " * level).encode("ascii")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


#: keys every results.json fedkit writes holds
RESULTS_KEYS = ("status", "config", "task", "rounds", "final")
#: the type of each top-level value of a results.json
RESULTS_TYPES = {
    "status": str,
    "config": dict,
    "task": dict,
    "rounds": list,
    "final": dict,
    "events": list,
}

#: config keys that label a run, set who may read it or which figure formats it writes,
#: without changing its results: left out of the config hash
HASH_IGNORES = ("name", "private", "figure_formats")


def config_hash(nested: Mapping[str, Any]) -> str:
    """SHA-256 of a resolved config (nested, as in ``config.yaml``): canonical JSON (sorted
    keys, no spaces) of every key but :data:`HASH_IGNORES`."""
    kept = {k: v for k, v in nested.items() if k not in HASH_IGNORES}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()


def _flat(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        elif f"{prefix}{key}" not in HASH_IGNORES:
            out[f"{prefix}{key}"] = value
    return out


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for every dotted key whose value differs (``-`` where absent)."""
    a, b = _flat(old), _flat(new)
    return [
        f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k, "-") != b.get(k, "-")
    ]


def changed_keys(
    old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Any]
) -> list[str]:
    """The dotted keys whose values differ between two flat configs, except a key one side
    lacks that the other holds at its default (``defaults``): an option fedkit gained in
    between, which gives the behaviour before it."""
    return [
        k
        for k in sorted(old.keys() | new.keys())
        if old.get(k, "-") != new.get(k, "-")
        and not (
            (k in old) != (k in new) and k in defaults and old.get(k, new.get(k)) == defaults[k]
        )
    ]


def only_new_defaults(
    old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Any]
) -> bool:
    """Whether ``new`` differs from ``old`` only by options fedkit gained, at their defaults."""
    return not changed_keys(_flat(old), _flat(new), defaults)


class RunDir:
    """The files of one run: config.yaml, config.sha256, results.json, metrics.csv, plots,
    checkpoint/, and run.lock while a process writes it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    config = property(lambda self: self.path / "config.yaml")
    config_sha256 = property(lambda self: self.path / "config.sha256")
    lock_file = property(lambda self: self.path / "run.lock")
    results = property(lambda self: self.path / "results.json")
    metrics_csv = property(lambda self: self.path / "metrics.csv")
    checkpoint = property(lambda self: self.path / "checkpoint")
    edits_log = property(lambda self: self.path / "config-edits.log")

    def is_run(self) -> bool:
        return self.config.is_file()

    def create(self, nested: Mapping[str, Any]) -> None:
        """Make the folder of a new run of config ``nested``; refuse one that holds a run,
        and a folder that holds anything but a run (the user's files are never overwritten)."""
        self._mkdir(private=bool(nested.get("private")))
        if self.is_run():
            self.require_config(nested)
            raise FedkitError(
                f"{self.path} already holds a run of this config: continue it with "
                f"`fedkit resume {self.path}`, or choose another --out"
            )
        foreign = sorted(p.name for p in self.path.iterdir() if not _ours(p))
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise FedkitError(
                f"--out {self.path} is a folder that is not a fedkit run and holds {shown}; "
                "nothing in it is overwritten: choose a new or empty folder"
            )
        if nested.get("private"):  # before anything is written in it: see file_mode
            self.path.chmod(0o700)

    def discard_config(self) -> None:
        """Forget the config of a run that failed before its first results (bad data, a
        model that does not build), so that the corrected config can be run here again."""
        if not self.results.exists():
            self.config.unlink(missing_ok=True)
            self.config_sha256.unlink(missing_ok=True)

    def _mkdir(self, private: bool = False) -> None:
        """Make the run's folder and its missing parents; ``private``: each of them 0700
        (``fedkit compare --private`` makes each runspec's folder so)."""
        if self.path.exists() and not self.path.is_dir():
            raise FedkitError(f"--out {self.path} is a file; give a folder for the run")
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        for folder in reversed(missing):
            folder.mkdir(mode=0o700 if private else 0o777, exist_ok=True)

    def save_config(self, nested: Mapping[str, Any]) -> None:
        """Write ``config.yaml`` and its hash ``config.sha256``."""
        self.write_config_only(nested)
        write_text(self.config_sha256, config_hash(nested) + "\n")

    def write_config_only(self, nested: Mapping[str, Any]) -> None:
        """Rewrite ``config.yaml`` and keep ``config.sha256``: an edit that
        :meth:`check_edits` will see (``fedkit resume --rounds``)."""
        write_text(self.config, yaml.safe_dump(dict(nested), sort_keys=False))

    def config_hash(self) -> str:
        """The recorded config hash (computed from config.yaml for runs older than the hash)."""
        if self.config_sha256.is_file():
            return self.config_sha256.read_text().strip()
        return config_hash(self.load_config())

    def require_config(
        self, nested: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
    ) -> None:
        """Refuse (exit 2) when this run was made with another config than ``nested``, naming
        the differing keys: a run is never reused or overwritten for another config.

        A key the run's config lacks because fedkit gained the option after the run was made
        is no difference when ``nested`` holds it at its default (``defaults``: dotted key ->
        default): an option added to fedkit defaults to the behaviour before it, so runs made
        by an earlier version stay reusable."""
        if self.config_hash() == config_hash(nested):
            return
        old = self.load_config()
        if defaults is not None and only_new_defaults(old, nested, defaults):
            return
        diff = config_diff(old, nested) or [
            f"{self.config_sha256.name} does not match its config.yaml"
        ]
        was, now = old.get("rounds"), nested.get("rounds")
        longer = isinstance(was, int) and isinstance(now, int) and now > was
        extend = (
            f", extend it with `fedkit resume {self.path} --rounds {now}`"
            if longer and diff == [f"rounds: {was} -> {now}"]
            else ""
        )
        raise FedkitError(
            f"{self.path} holds a run of another config ({'; '.join(diff)}); it is neither "
            f"reused nor overwritten: choose another --out{extend}, or delete {self.path} to "
            "run it again"
        )

    def recorded_hash(self) -> str | None:
        """The hash in ``config.sha256``; None when it is missing or unreadable."""
        try:
            text = self.config_sha256.read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None
        return text if re.fullmatch(r"[0-9a-f]{64}", text) else None

    def recorded_config(self) -> dict[str, Any] | None:
        """The config results.json records (None: no readable results.json)."""
        try:
            config = self.load_results().get("config")
        except FedkitError:
            return None
        return config if isinstance(config, dict) else None

    def check_edits(
        self,
        accept: bool,
        committed: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        """Refuse a ``config.yaml`` edited since the run started, naming the changed keys,
        unless ``accept`` or the only edit is more ``rounds`` (a run extended); an accepted
        edit is recorded in ``config-edits.log`` with its values before and after, and the
        new config is taken.

        What the run ran under comes from ``committed`` (the config of the last
        checkpointed round), else results.json; ``config.sha256`` tells an edit too. With
        none of them readable an edit cannot be told apart, so resuming needs ``accept``.
        A key one side lacks that the other holds at its default (``defaults``: dotted key ->
        default) is an option fedkit gained in between, not an edit."""
        nested = self.load_config()
        recorded = self.recorded_hash()
        before = dict(committed) if committed is not None else self.recorded_config()
        if recorded is None and before is None:
            if not accept:
                raise FedkitError(
                    f"the record of the config {self.path} was started with is missing or "
                    f"unreadable ({self.config_sha256.name}, {self.results.name} and the "
                    "checkpoint's), so an edit of config.yaml cannot be told apart: resume "
                    "with --accept-edits if config.yaml is the config to continue with "
                    "(recorded in config-edits.log)"
                )
            self._log_edit(
                "resumed without a record of the config it started with (config.sha256, "
                "results.json and the checkpoint's missing or unreadable); continued with "
                f"config.yaml as it is (sha256 {config_hash(nested)})"
            )
            return
        new_hash = config_hash(nested)
        edited = (recorded is not None and recorded != new_hash) or (
            before is not None and config_hash(before) != new_hash
        )
        if not edited:
            return
        old, new = _flat(before or {}), _flat(nested)
        changed = changed_keys(old, new, defaults or {})
        if before is not None and not changed:
            return
        if before is None:
            changes = (
                f"config.yaml differs from {self.config_sha256.name}; the values before are "
                "not recorded (results.json and the checkpoint's record are missing)"
            )
        else:
            changes = "; ".join(
                line for line in config_diff(old, new) if line.split(":")[0] in changed
            )
        rounds = [old.get("rounds"), new.get("rounds")]
        extended = changed == ["rounds"] and all(isinstance(r, int) for r in rounds)
        if not (accept or (extended and rounds[1] > rounds[0])):
            raise FedkitError(
                f"{self.config} was edited after the run started ({changes}); the rounds so "
                "far ran with the old values, so it is not resumed: undo the edit, start a new "
                "run with the new config, or resume with --accept-edits to continue with it "
                "(recorded in config-edits.log and results.json)"
            )
        self._log_edit(f"resumed with an edited config: {changes}")
        write_text(self.config_sha256, new_hash + "\n")

    def _log_edit(self, text: str) -> None:
        log = self.edits_log.read_text() if self.edits_log.is_file() else ""
        write_text(self.edits_log, log + f"{datetime.now():%Y-%m-%d %H:%M:%S} {text}\n")

    @contextmanager
    def lock(self, private: bool = False) -> Iterator[None]:
        """Hold ``run.lock`` (pid, host, start time) while writing the run; exit 2 when a live
        process holds it. A lock left by a dead process on this host is taken over; one from
        another host is never taken over, as its process cannot be checked from here.
        ``private``: the folders made for it are 0700 (a private run's, see :meth:`create`)."""
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": f"{datetime.now()}"}
        try:
            self._mkdir(private)
            claimed = self._claim(mine)
        except OSError as err:
            if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            raise FedkitError(
                f"the run folder {self.path} cannot be written ({err.strerror}): a run writes "
                f"its results and checkpoints there. Make it writable, or copy it to a "
                f"writable place (cp -r {self.path} NEW) and run the command on the copy"
            ) from None
        if not claimed:
            self._break_stale()
            if not self._claim(mine):
                self._refuse(self._holder())
        self._remove_orphans()
        try:
            yield
        finally:
            if self._holder() == mine:
                self.lock_file.unlink(missing_ok=True)

    def _remove_orphans(self) -> None:
        """Delete the temporary files (``.NAME.XXXX.tmp``) of writers killed mid-write: with
        run.lock held, no other process writes this run."""
        for top, _, files in os.walk(self.path):  # symbolic links are not followed
            for name in files:
                # a lock claim's file is another process's, about to be linked
                if _ours(Path(name)) and not name.startswith((".run.lock", "run.lock")):
                    Path(top, name).unlink(missing_ok=True)

    def _claim(self, mine: Mapping[str, Any]) -> bool:
        """Create run.lock with its content in one step (link of a complete temporary file)."""
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".run.lock.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(mine, fh)
            os.link(tmp, self.lock_file)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _holder(self) -> dict[str, Any]:
        try:
            holder = json.loads(self.lock_file.read_text())
        except FileNotFoundError:
            return {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {"pid": None, "host": "?", "since": "?"}
        return holder if isinstance(holder, dict) else {"pid": None, "host": "?", "since": "?"}

    def _break_stale(self) -> None:
        holder = self._holder()
        pid, host = holder.get("pid"), holder.get("host")
        if not holder or (
            host == socket.gethostname() and isinstance(pid, int) and process_alive(pid)
        ):
            return
        if host != socket.gethostname():
            self._refuse(holder)
        self.lock_file.unlink(missing_ok=True)

    def _refuse(self, holder: Mapping[str, Any]) -> None:
        pid, host = holder.get("pid"), holder.get("host")
        where = "" if host == socket.gethostname() else f" on host {host}"
        raise FedkitError(
            f"run {self.path} is being written by process {pid}{where} (since "
            f"{holder.get('since')}); wait for it to end, or, if that process is gone, delete "
            f"{self.lock_file}"
        )

    def load_config(self) -> dict[str, Any]:
        if not self.is_run():
            raise FedkitError(f"{self.path} is not a fedkit run directory (no config.yaml)")
        try:
            text = self.config.read_text()
            return _mapping(safe_yaml(text, str(self.config)) or {}, self.config)
        except UnicodeDecodeError as err:
            raise FedkitError(f"{self.config} is corrupt: {err}") from None

    def load_results(self) -> dict[str, Any]:
        if not self.results.is_file():
            raise FedkitError(
                f"{self.path} has no results.json (not a fedkit run, or it never finished a round)"
            )
        try:
            results = _mapping(json.loads(self.results.read_text()), self.results)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise FedkitError(f"{self.results} is corrupt: {err}") from None
        except RecursionError:
            raise FedkitError(f"{self.results} is corrupt: it nests too deep") from None
        missing = [key for key in RESULTS_KEYS if key not in results]
        if missing:
            raise FedkitError(
                f"{self.results} is not a fedkit results file (no {', '.join(missing)})"
            )
        wrong = [
            f"{key} is a {type(results[key]).__name__}, not a {kind.__name__}"
            for key, kind in RESULTS_TYPES.items()
            if key in results and not isinstance(results[key], kind)
        ]
        if wrong or not all(isinstance(r, dict) for r in results["rounds"]):
            wrong = wrong or ["rounds holds something other than round records"]
            raise FedkitError(f"{self.results} is damaged or not fedkit's ({'; '.join(wrong)})")
        return results


def _ours(path: Path) -> bool:
    """A file a run may hold before its config: its lock, or a temporary file."""
    return path.name == "run.lock" or (path.name.startswith(".") and path.name.endswith(".tmp"))


class OwnedOutputs:
    """The files a command writes into a folder the user names (``fedkit compare -o``),
    listed with their SHA-256 in a manifest there, so that the next run of the command
    removes exactly those (stale summaries never outlive it) and nothing of the user's.

    A folder holding anything else is refused, as ``run -o`` refuses a folder that is not a
    run: a file the manifest does not list (or one changed since it was written), or a
    subfolder that is neither one of ``folders`` (the command's own, e.g. its run folders)
    nor listed in the manifest nor made only of fedkit run folders."""

    def __init__(self, folder: str | Path, manifest: str):
        self.folder = Path(folder)
        self.manifest = self.folder / manifest

    def _listed(self) -> dict[str, Any]:
        try:
            listed = json.loads(self.manifest.read_text())
        except FileNotFoundError:
            return {"files": {}, "folders": []}
        except (OSError, ValueError) as err:
            raise FedkitError(
                f"{self.manifest} is unreadable ({type(err).__name__}); it lists the files "
                f"fedkit wrote in {self.folder}: delete it, and those files, to write there"
            ) from None
        if not (
            isinstance(listed, dict)
            and isinstance(listed.get("files"), dict)
            and isinstance(listed.get("folders"), list)
        ):
            raise FedkitError(f"{self.manifest} is not a list of fedkit's outputs: delete it")
        bad = [n for n in [*listed["files"], *listed["folders"]] if not plain_name(n)]
        if bad:  # a manifest naming ../x or /x would have fedkit remove a file outside
            raise FedkitError(
                f"{self.manifest} names {_some([repr(n) for n in bad])}, not a file of "
                f"{self.folder}: fedkit did not write this list; delete it (nothing was removed)"
            )
        return listed

    def claim(self, folders: Iterable[str]) -> None:
        """Refuse a folder holding what is not fedkit's (see the class), then remove the
        files an earlier run of the command wrote there."""
        if self.folder.exists() and not self.folder.is_dir():
            raise FedkitError(f"--out {self.folder} is a file; give a folder")
        if not self.folder.is_dir():
            return
        listed = self._listed()
        known = set(folders) | {str(f) for f in listed["folders"]}
        foreign, changed = [], []
        kept = fedkit_written(self.folder)  # fedkit's figures of runs kept there (report)
        for entry in sorted(self.folder.iterdir(), key=lambda p: p.name):
            name = entry.name
            if entry == self.manifest or _ours(entry) or name in kept or name == WRITTEN:
                continue
            if entry.is_dir() and not entry.is_symlink():
                if name not in known and not _only_runs(entry):
                    foreign.append(name + "/")
            elif name not in listed["files"]:
                foreign.append(name)
            elif (
                entry.is_symlink() or not entry.is_file() or _digest(entry) != listed["files"][name]
            ):
                changed.append(name)
        if foreign or changed:
            said = []
            if foreign:
                said.append(f"holds {_some(foreign)}, which fedkit did not write")
            if changed:
                said.append(f"{_some(changed)} changed since fedkit wrote them")
            raise FedkitError(
                f"--out {self.folder}: {' and '.join(said)}; nothing in it is removed or "
                "overwritten: choose a new or empty folder, or move those files out"
            )
        for name in listed["files"]:  # each checked above: a plain file, as fedkit wrote it
            (self.folder / name).unlink(missing_ok=True)
        for tmp in self.folder.glob(".*.tmp"):  # a killed writer's; none of them is running
            tmp.unlink(missing_ok=True)
        self.manifest.unlink(missing_ok=True)

    def record(self, folders: Iterable[str]) -> None:
        """List the files now in the folder (all written since :meth:`claim`) and
        ``folders`` in the manifest."""
        kept = fedkit_written(self.folder) | {WRITTEN}  # a report's, which it replaces
        files = {
            p.name: _digest(p)
            for p in sorted(self.folder.iterdir())
            if p.is_file() and p != self.manifest and not _ours(p) and p.name not in kept
        }
        write_json(self.manifest, {"files": files, "folders": sorted(set(folders))})


#: the list of files fedkit wrote into a folder that is not its own (``fedkit report``'s
#: overlay figure in the runs' common folder), each with its SHA-256
WRITTEN = ".fedkit-written.json"


def plain_name(name: Any) -> bool:
    """Whether ``name`` names an entry directly inside a folder (no ``..``, no separator,
    not absolute): the only names a manifest of fedkit's may hold."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def fedkit_written(folder: Path) -> set[str]:
    """The names of the files in ``folder`` that fedkit wrote there (:data:`WRITTEN`) and
    that still hold what it wrote: plain files inside the folder, their digests matching."""
    try:
        listed = json.loads((Path(folder) / WRITTEN).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(listed, dict):
        return set()
    out = set()
    for name, digest in listed.items():
        path = Path(folder) / str(name)
        if plain_name(name) and not path.is_symlink() and path.is_file():
            out.update([name] if _digest(path) == digest else [])
    return out


def refuse_foreign(paths: Iterable[Path], flag: str) -> None:
    """Refuse to write ``paths`` (outside any run folder of their own) where one is a file
    fedkit did not write, or changed since (see :func:`note_written`), naming it and the
    ``flag`` that chooses another place: the user's own files are never overwritten."""
    for path in map(Path, paths):
        if not (path.exists() or path.is_symlink()):
            continue
        if path.name not in fedkit_written(path.parent):
            raise FedkitError(
                f"{path} exists and fedkit did not write it (or it changed since): it is not "
                f"overwritten; choose another place with {flag}, or move that file"
            )


def note_written(paths: Iterable[Path]) -> None:
    """Record ``paths`` (just written) with their digests in their folder's
    :data:`WRITTEN`, so that a later writer may replace them (:func:`refuse_foreign`) and
    ``fedkit compare -o`` there knows them for fedkit's."""
    by_folder: dict[Path, list[Path]] = {}
    for path in map(Path, paths):
        by_folder.setdefault(path.parent, []).append(path)
    for folder, written in by_folder.items():
        try:
            listed = json.loads((folder / WRITTEN).read_text())
        except (OSError, ValueError):
            listed = {}
        kept = {n: listed[n] for n in fedkit_written(folder)} if isinstance(listed, dict) else {}
        kept.update({p.name: _digest(p) for p in written if p.is_file()})
        write_json(folder / WRITTEN, kept)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _only_runs(folder: Path) -> bool:
    """Whether ``folder`` holds fedkit run folders and nothing else (a comparison's)."""
    entries = list(folder.iterdir())
    return bool(entries) and all(p.is_dir() and RunDir(p).is_run() for p in entries)


def writable(folder: Path) -> bool:
    """Whether files can be written in ``folder`` (or, where it does not exist yet, in the
    nearest folder above it): not on a read-only file system nor a folder the user may
    only read."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK | os.X_OK)


def remove_unstarted(path: Path) -> bool:
    """Remove the folder ``path`` that :func:`default_out` made for a run that then failed
    before its first round (no ``results.json``; its config is discarded already), so that
    failed attempts leave no empty folders in ``runs/``. Returns whether it was removed."""
    path = Path(path)
    if not path.is_dir() or RunDir(path).results.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def default_out(config: Mapping[str, Any], create: bool = True) -> Path:
    """A new run directory for ``config``: ``runs/<name or plugins-task-model>-<time>[-n]``,
    the model followed by the aggregation mode, the sites and the DP level where they are
    not the defaults (``fedavg-npz-efficientnet_lite0-fedbuff-rural-dp-client-...``).

    With ``create`` the folder is made here, atomically, so that two runs started in the
    same second never share one; without (a folder on another machine), it is only named.
    """
    label = config["name"] or "-".join(
        [method_label(config), config["task.name"], *setting_parts(config)]
    )
    base = Path("runs") / f"{folder_name(label)}-{datetime.now():%Y%m%d-%H%M%S}"
    path, n = base, 1
    while True:
        if create:
            try:
                path.mkdir(parents=True)
                return path
            except FileExistsError:
                pass
        elif not path.exists():
            return path
        n += 1
        path = base.with_name(f"{base.name}-{n}")
