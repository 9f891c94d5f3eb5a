"""A run directory and atomic writes: a reader never sees a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import yaml

from fedkit_core.errors import FedkitError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: permission bits of written files: 0666 less the umask, as open() would give (mkstemp's
#: temporary file is 0600, which would hide shared caches and results from colleagues)
_MODE = 0o666 & ~_umask()


def _atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mapping(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise FedkitError(f"{path} is corrupt: it holds a {type(data).__name__}, not a mapping")
    return data


def write_text(path: Path, text: str) -> None:
    _atomic(Path(path), lambda fh: fh.write(text.encode()))


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n")


def write_torch(path: Path, obj: Any) -> None:
    import torch

    _atomic(Path(path), lambda fh: torch.save(obj, fh))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class RunDir:
    """The files of one run: config.yaml, results.json, metrics.csv, plots, checkpoint/."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    config = property(lambda self: self.path / "config.yaml")
    results = property(lambda self: self.path / "results.json")
    metrics_csv = property(lambda self: self.path / "metrics.csv")
    checkpoint = property(lambda self: self.path / "checkpoint")

    def is_run(self) -> bool:
        return self.config.is_file()

    def create(self) -> None:
        if self.is_run():
            raise FedkitError(
                f"{self.path} already holds a run: continue it with `fedkit resume {self.path}`, "
                "or choose another --out"
            )
        if self.path.exists() and not self.path.is_dir():
            raise FedkitError(f"--out {self.path} is a file; give a folder for the run")
        self.path.mkdir(parents=True, exist_ok=True)

    def save_config(self, nested: dict[str, Any]) -> None:
        write_text(self.config, yaml.safe_dump(nested, sort_keys=False))

    def load_config(self) -> dict[str, Any]:
        if not self.is_run():
            raise FedkitError(f"{self.path} is not a fedkit run directory (no config.yaml)")
        try:
            return _mapping(yaml.safe_load(self.config.read_text()) or {}, self.config)
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise FedkitError(f"{self.config} is corrupt: {err}") from None

    def load_results(self) -> dict[str, Any]:
        if not self.results.is_file():
            raise FedkitError(
                f"{self.path} has no results.json (not a fedkit run, or it never finished a round)"
            )
        try:
            return _mapping(json.loads(self.results.read_text()), self.results)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise FedkitError(f"{self.results} is corrupt: {err}") from None


def default_out(config: Mapping[str, Any]) -> Path:
    """A new run directory for ``config``: ``runs/<name or plugins-task>-<time>``."""
    label = config["name"] or "+".join(config["plugins"] or ["fedavg"]) + "-" + config["task.name"]
    base = Path("runs") / f"{label}-{datetime.now():%Y%m%d-%H%M%S}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
