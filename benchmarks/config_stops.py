"""How far a run's config travels: its key reads followed through a tiny local run.

A run's resolved config is one object (:class:`fedkit_core.config.Config`); every module
that needs a setting reads it there. This script runs the default synthetic task on the
local engine in this process (``fedkit_core.api.run``: resolve, set up, ``--rounds`` rounds,
no output folder, ``local.workers=0``) with that class's reads recorded:

* a **read** is a call of ``Config.__getitem__`` (``config[key]``, and through it
  ``config.get``, ``key in config``), ``Config.section`` or ``Config.nested``, made
  anywhere from resolving the config to the run's end;
* its **site** is the line that made it: the first frame on the call stack in a file of the
  repository (``fedkit_core/`` or ``plugins/``) other than ``fedkit_core/config.py`` itself
  (the Mapping methods are skipped); its **file**, that line's file;
* following the config is reading its sites in the order the run first reaches them: a
  site read again (every training step reads the loss settings) is no new place to look,
  so only a site's first read counts;
* a **stop** is a maximal run of consecutive (first) reads from one file; the figures are
  the number of stops, of distinct files, of **returns** (stops in a file that an earlier
  stop already left) and of **climbs** (stops in a module of a lower layer number than
  the stop before: the layers of ``docs/architecture.md`` as ``tests/test_layers.py``
  reads them; a stop outside ``fedkit_core`` has no layer and is never a climb, nor the
  stop after it).

The same figures over every read (a site's repeats included, which grow with the rounds
and steps) are printed on a second line. The script imports nothing but ``fedkit_core``'s
run function, its ``Config`` class and the repository's ``tests/test_layers.py``, found
beside the ``fedkit_core`` on the path, so it measures any checkout
(``PYTHONPATH=/path/to/checkout python benchmarks/config_stops.py``). Reads depend on the
code, not on the machine: the figures are exact counts.

    python benchmarks/config_stops.py [--rounds 2] [--trace]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import fedkit_core
from fedkit_core.config import Config

ROOT = Path(fedkit_core.__file__).resolve().parents[1]
CONFIG_FILE = Path(sys.modules[Config.__module__].__file__).resolve()
ME = Path(__file__).resolve()


def _layers() -> tuple[Any, Any]:
    """``layer_table`` of the checkout's docs/architecture.md and its ``layer_of``."""
    spec = importlib.util.spec_from_file_location("_layers", ROOT / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.layer_table(ROOT / "docs" / "architecture.md"), module.layer_of


def _reader(frame: Any) -> tuple[str, int]:
    """The site (repository file, relative path, and line) that made the read at
    ``frame``."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_absolute() and path != CONFIG_FILE and path != ME:
            try:
                rel = path.resolve().relative_to(ROOT)
            except ValueError:
                rel = None
            if rel is not None and rel.parts[0] in ("fedkit_core", "plugins"):
                return rel.as_posix(), frame.f_lineno
        frame = frame.f_back
    return "(outside the repository)", 0


def record(reads: list[tuple[str, int]]) -> None:
    """Wrap ``Config``'s read methods so that every read appends its site to ``reads``."""
    for name in ("__getitem__", "section", "nested"):
        original = getattr(Config, name)

        def wrapped(self: Config, *args: Any, _original: Any = original) -> Any:
            reads.append(_reader(sys._getframe(1)))
            return _original(self, *args)

        setattr(Config, name, wrapped)


def stops_of(reads: list[tuple[str, int]], first: bool) -> list[tuple[str, int]]:
    """(file, reads) per stop, in order; with ``first``, only each site's first read."""
    if first:
        reads = list(dict.fromkeys(reads))
    stops: list[tuple[str, int]] = []
    for file, _ in reads:
        if stops and stops[-1][0] == file:
            stops[-1] = (file, stops[-1][1] + 1)
        else:
            stops.append((file, 1))
    return stops


def module_of(file: str) -> str | None:
    """The dotted module of a fedkit_core file (None outside fedkit_core)."""
    if not file.startswith("fedkit_core/"):
        return None
    parts = file[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def figures(stops: list[tuple[str, int]], table: Any, layer_of: Any) -> dict[str, int]:
    """Stops, files, returns and climbs of ``stops`` (see the module docstring)."""
    seen: set[str] = set()  # the files of the stops so far (each one left since)
    returns = climbs = 0
    before: int | None = None
    for file, _ in stops:
        returns += file in seen
        seen.add(file)
        module = module_of(file)
        layer = layer_of(module, table) if module else None
        if layer is not None and before is not None and layer < before:
            climbs += 1
        before = layer
    files = len({file for file, _ in stops})
    return {"stops": len(stops), "files": files, "returns": returns, "climbs": climbs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trace", action="store_true", help="print every stop")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    table, layer_of = _layers()
    reads: list[tuple[str, int]] = []
    record(reads)
    from fedkit_core.api import run

    run({"rounds": args.rounds, "local": {"workers": "0"}})
    stops = stops_of(reads, first=True)
    if args.trace:
        for i, (file, count) in enumerate(stops, 1):
            module = module_of(file)
            layer = layer_of(module, table) if module else None
            print(f"{i:4d}  layer {'-' if layer is None else layer + 1:>2}  {count:4d}  {file}")
    sites = len(set(reads))
    print(f"checkout: {ROOT}")
    setting = f"rounds={args.rounds}, default synthetic task, engine local"
    print(f"{setting}: {len(reads)} reads at {sites} sites")
    for label, first in (("first reads", True), ("every read ", False)):
        counts = figures(stops_of(reads, first), table, layer_of)
        print(
            f"{label}: stops {counts['stops']}  files {counts['files']}  "
            f"returns {counts['returns']}  climbs {counts['climbs']}"
        )


if __name__ == "__main__":
    main()
