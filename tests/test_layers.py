"""The core's layers, as docs/architecture.md ("## Layers") lists them, import one another
only downward: each module imports only from its own layer or the layers above it, at module
level, inside functions and under ``if TYPE_CHECKING`` alike. The runtime imports (module and
function level) have no cycles, and the API reaches engines only through the registry
(engines are peers, none special to ``api``).

Folders are layers too. A folder is a directory of ``fedkit_core`` (``engines``,
``engines/flower``, ``privacy``, ``results``, ``contract``, ``cli`` ...; a subfolder is a
folder of its own); a module directly in ``fedkit_core/`` (``config``, ``resolve``, ``api``
...) is a folder of its own, and so is the package's ``__init__`` (``fedkit_core``), since
the root holds modules of every layer from ``errors`` to ``api``. Folder A imports folder B
when a module of A imports a module of B (any kind, as above). Folders are layers when
there is an order of the folders that every import between folders follows (a folder imports
only folders on its own or lower layers), that is when the imports between folders have no
cycle. An **upward arrow between folders** is an import between two folders that reach each
other through imports: whatever the order, some arrow of each such cycle climbs, and with
none there is an order that none climbs; ``test_folders_are_layers`` fails on any.

``python tests/test_layers.py [ROOT] [--layers FILE]`` prints the house: the modules of each
layer, the imports that climb (with where they are made), the import cycles, those hidden
behind function-level or ``TYPE_CHECKING`` imports included, and the upward arrows between
folders.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

#: the fenced block under this heading of docs/architecture.md is the layer table
LAYERS_HEADING = "## Layers"

#: Imports allowed to climb, each with why: {(importer, imported): reason}. Only lazy
#: imports of the command line belong here (a command may import what it drives when it
#: runs); today there are none: ``cli`` is the last layer, so its lazy imports all run down.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

#: Cycles closed only by an import inside a function (modules of one layer), each with why.
#: A new one fails ``test_no_import_cycles``.
KNOWN_LAZY_CYCLES: dict[frozenset[str], str] = {
    frozenset({"fedkit_core.results.schema", "fedkit_core.results.store"}): (
        "Results.load reads through RunDir, whose writer uses the schema's serialisers"
    ),
}

#: where an import is made
MODULE, FUNCTION, TYPING = "module", "function", "typing"


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    kind: str  # MODULE, FUNCTION or TYPING
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def imports_of(path: Path, name: str, known: set[str]) -> list[Import]:
    """Every import of a fedkit_core module in ``path`` (whose module is ``name``), with
    where it is made: at module level, inside a function, or under ``if TYPE_CHECKING``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def known_prefix(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: list[Import] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = FUNCTION if kind == MODULE else kind
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), TYPING)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), kind)
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join([*base, *([child.module] if child.module else [])])
                targets = [f"{module}.{a.name}" for a in child.names]
            for target in targets:
                imported = known_prefix(target)
                if imported and imported != name:
                    found.append(Import(name, imported, inner, child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text()), MODULE)
    return list(dict.fromkeys(found))


@functools.cache
def all_imports(root: Path = REPO_ROOT) -> dict[str, list[Import]]:
    """Every fedkit_core module of ``root`` with its imports of other fedkit_core modules
    (parsed once per root: the checks share it and none changes it)."""
    paths = {module_name(p, root): p for p in (root / "fedkit_core").rglob("*.py")}
    return {name: imports_of(path, name, set(paths)) for name, path in sorted(paths.items())}


def graph(root: Path = REPO_ROOT, kinds: tuple[str, ...] = (MODULE,)) -> dict[str, set[str]]:
    """Module -> the modules it imports in the given ways (default: at import time)."""
    return {
        name: {i.imported for i in found if i.kind in kinds}
        for name, found in all_imports(root).items()
    }


def folder_of(module: str, root: Path = REPO_ROOT) -> str:
    """The folder of ``module`` (see the module docstring): the directory it is in, dotted,
    or the module itself when it sits directly in ``fedkit_core/`` or is ``fedkit_core``."""
    parts = module.split(".")
    if (root.joinpath(*parts) / "__init__.py").is_file() or len(parts) <= 2:
        return module  # a package's __init__ is its folder; a top-level module its own
    return ".".join(parts[:-1])


def folder_graph(
    imports: dict[str, list[Import]], root: Path = REPO_ROOT
) -> dict[tuple[str, str], list[Import]]:
    """(importing folder, imported folder) -> the imports between them, any kind."""
    arrows: dict[tuple[str, str], list[Import]] = {}
    for found in imports.values():
        for i in found:
            a, b = folder_of(i.importer, root), folder_of(i.imported, root)
            if a != b:
                arrows.setdefault((a, b), []).append(i)
    return arrows


def upward_folder_arrows(
    arrows: dict[tuple[str, str], list[Import]],
) -> tuple[list[list[str]], list[tuple[str, str]]]:
    """The cycles between folders and the arrows inside them (the upward arrows)."""
    edges: dict[str, set[str]] = {}
    for a, b in arrows:
        edges.setdefault(a, set()).add(b)
    groups = cycles(edges)
    group_of = {f: frozenset(g) for g in groups for f in g}
    up = [(a, b) for a, b in sorted(arrows) if a in group_of and group_of[a] == group_of.get(b)]
    return groups, up


def _expand(entry: str) -> list[str]:
    """``engines/{client,server}`` -> ``fedkit_core.engines.client``, ``...server``."""
    head, brace, rest = entry.partition("{")
    if brace:
        inside, _, tail = rest.partition("}")
        names = [head + n.strip() + tail for n in inside.split(",")]
    else:
        names = [head]
    return [
        "fedkit_core" + ("." + n.strip().strip("/").replace("/", ".") if n != "fedkit_core" else "")
        for n in names
    ]


def layer_table(doc: Path) -> list[tuple[list[str], str]]:
    """The layer table of ``doc``: (module prefixes, description) per layer, the most basic
    first. A line is ``names   description`` (two or more spaces apart); the names are
    comma-separated paths under fedkit_core, where ``a/{b,c}`` means ``a/b, a/c``, a
    package's path stands for all its modules that no longer path names, and
    ``fedkit_core`` is the package's own ``__init__``."""
    block = doc.read_text().split(LAYERS_HEADING, 1)[1].split("```", 2)[1]
    table = []
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        names, about = (re.split(r"\s{2,}", line.strip(), maxsplit=1) + [""])[:2]
        entries = re.findall(r"[^,{\s][^,{]*(?:\{[^}]*\}[^,]*)?", names)
        table.append(([m for e in entries for m in _expand(e.strip())], about))
    return table


def layer_of(module: str, table: list[tuple[list[str], str]]) -> int | None:
    """The index of ``module``'s layer: the layer of the longest path naming it."""
    best: tuple[int, int] | None = None
    for index, (prefixes, _) in enumerate(table):
        for prefix in prefixes:
            names = module == prefix or (
                prefix != "fedkit_core" and module.startswith(prefix + ".")
            )
            if names and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def upward_imports(
    imports: dict[str, list[Import]], table: list[tuple[list[str], str]]
) -> list[Import]:
    """Imports of a module from a layer below its own (any kind), less the allowed ones."""
    return [
        i
        for found in imports.values()
        for i in found
        if (i.importer, i.imported) not in ALLOWED_UPWARD
        and (a := layer_of(i.importer, table)) is not None
        and (b := layer_of(i.imported, table)) is not None
        and b > a
    ]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            connect(v)
    return groups


def _short(name: str) -> str:
    return name.removeprefix("fedkit_core.")


def report(root: Path = REPO_ROOT, layers: Path | None = None) -> str:
    """The house in text: modules per layer, upward imports, cycles."""
    table = layer_table(layers or root / "docs" / "architecture.md")
    imports = all_imports(root)
    out = [f"fedkit_core at {root}: {len(imports)} modules, {len(table)} layers"]
    placed: dict[int, list[str]] = {}
    for name in imports:
        placed.setdefault(-1 if (i := layer_of(name, table)) is None else i, []).append(name)
    for index, (prefixes, about) in enumerate(table):
        names = placed.get(index, [])
        out.append(f"\n{index + 1:2d}. {about or ', '.join(map(_short, prefixes))} ({len(names)})")
        out.append("    " + " ".join(_short(n) for n in names))
    if placed.get(-1):
        out.append(f"\nin no layer ({len(placed[-1])}): " + " ".join(map(_short, placed[-1])))
    up = upward_imports(imports, table)
    by_kind = {k: [i for i in up if i.kind == k] for k in (MODULE, FUNCTION, TYPING)}
    out.append(
        f"\nupward imports: {len(up)} ({', '.join(f'{len(v)} {k}-level' for k, v in by_kind.items())})"
    )
    for i in sorted(up, key=lambda i: (i.importer, i.imported)):
        a, b = layer_of(i.importer, table), layer_of(i.imported, table)
        out.append(
            f"  {_short(i.importer)}:{i.line} [{a + 1}] -> {_short(i.imported)} [{b + 1}] ({i.kind})"
        )
    for label, kinds in (
        ("at import time", (MODULE,)),
        ("with function-level imports", (MODULE, FUNCTION)),
        ("with TYPE_CHECKING imports too", (MODULE, FUNCTION, TYPING)),
    ):
        found = cycles({n: {i.imported for i in f if i.kind in kinds} for n, f in imports.items()})
        out.append(f"\nimport cycles {label}: {len(found)}")
        out += ["  " + " <-> ".join(map(_short, group)) for group in found]
    arrows = folder_graph(imports, root)
    groups, up_folders = upward_folder_arrows(arrows)
    folders = {folder_of(n, root) for n in imports}
    out.append(
        f"\nfolders: {len(folders)}, arrows between them: {len(arrows)}, "
        f"upward arrows between folders: {len(up_folders)} in {len(groups)} cycle(s)"
    )
    out += ["  cycle: " + " <-> ".join(map(_short, group)) for group in groups]
    for a, b in up_folders:
        made = sorted({(_short(i.importer), i.line, i.kind) for i in arrows[(a, b)]})
        where = ", ".join(f"{m}:{line} ({kind})" for m, line, kind in made[:3])
        more = f" +{len(made) - 3}" if len(made) > 3 else ""
        out.append(f"  {_short(a)} -> {_short(b)}: {where}{more}")
    return "\n".join(out)


# --- the checks ------------------------------------------------------------------------


def test_every_module_has_a_layer():
    table = layer_table(REPO_ROOT / "docs" / "architecture.md")
    assert not [n for n in all_imports() if layer_of(n, table) is None]


def test_imports_run_downward():
    table = layer_table(REPO_ROOT / "docs" / "architecture.md")
    up = upward_imports(all_imports(), table)
    assert not up, "imports that climb the layers of docs/architecture.md:\n" + "\n".join(
        f"  {i.importer}:{i.line} -> {i.imported} ({i.kind}-level)" for i in up
    )


def test_allowed_upward_imports_are_still_made():
    made = {(i.importer, i.imported) for f in all_imports().values() for i in f}
    assert not set(ALLOWED_UPWARD) - made, "stale entries in ALLOWED_UPWARD"


def test_no_import_cycles():
    assert not cycles(graph())  # at import time
    lazy = [
        c for c in cycles(graph(kinds=(MODULE, FUNCTION))) if frozenset(c) not in KNOWN_LAZY_CYCLES
    ]
    assert not lazy, f"import cycles closed by function-level imports: {lazy}"


def test_known_lazy_cycles_still_exist():
    found = {frozenset(c) for c in cycles(graph(kinds=(MODULE, FUNCTION)))}
    assert not set(KNOWN_LAZY_CYCLES) - found, "stale entries in KNOWN_LAZY_CYCLES"


def test_folders_are_layers():
    groups, up = upward_folder_arrows(folder_graph(all_imports()))
    assert not groups, f"folders that import one another (no folder order exists): {groups}\n{up}"


def test_the_folder_check_finds_a_cycle_between_folders():
    a = Import("fedkit_core.results.store", "fedkit_core.privacy.layer", MODULE, 1)
    b = Import("fedkit_core.privacy.layer", "fedkit_core.results.store", FUNCTION, 2)
    c = Import("fedkit_core.privacy.layer", "fedkit_core.errors", MODULE, 3)
    groups, up = upward_folder_arrows(folder_graph({"x": [a, b, c]}))
    assert groups == [["fedkit_core.privacy", "fedkit_core.results"]]
    assert up == [
        ("fedkit_core.privacy", "fedkit_core.results"),
        ("fedkit_core.results", "fedkit_core.privacy"),
    ]
    assert folder_of("fedkit_core.engines.flower.node") == "fedkit_core.engines.flower"
    assert folder_of("fedkit_core.engines.flower") == "fedkit_core.engines.flower"
    assert folder_of("fedkit_core.config") == "fedkit_core.config"
    assert folder_of("fedkit_core") == "fedkit_core"


@pytest.mark.slow
def test_the_plugin_api_loads_neither_engines_nor_results():
    """``import fedkit_core.plugin`` (what every plugin does) stays below the engines'
    client and server and the results layer."""
    code = (
        "import sys, fedkit_core.plugin; print(' '.join(m for m in sys.modules "
        "if m.startswith(('fedkit_core.engines.client', 'fedkit_core.engines.server', "
        "'fedkit_core.results', 'fedkit_core.api'))))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    ).stdout.split()
    assert not found, f"importing fedkit_core.plugin loads {found}"


def test_api_reaches_engines_only_through_the_registry():
    edges = graph()
    engines = {
        n
        for n in edges
        if n.startswith(("fedkit_core.engines.local", "fedkit_core.engines.flower"))
    }
    assert not edges["fedkit_core.api"] & engines
    assert not [n for n in engines if "fedkit_core.api" in edges[n]]


def largest_classes(root: Path = REPO_ROOT, folder: str = "fedkit_core/engines") -> str:
    """The largest class (lines) of each module directly in ``folder`` and server.py's
    length: the sizes issue 46 bounds (300 lines, 250 a class)."""
    lines = []
    for path in sorted((root / folder).glob("*.py")):
        tree = ast.parse(path.read_text())
        sizes = [
            (n.end_lineno - n.lineno + 1, n.name) for n in tree.body if isinstance(n, ast.ClassDef)
        ]
        if sizes:
            lines.append(f"  {path.name}: {max(sizes)[1]} {max(sizes)[0]}")
    server = len((root / folder / "server.py").read_text().splitlines())
    return f"largest class per module of {folder} (lines); server.py {server} lines\n" + "\n".join(
        lines
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    layers_file = None
    if "--layers" in args:
        at = args.index("--layers")
        layers_file = Path(args[at + 1])
        del args[at : at + 2]
    print(report(Path(args[0]).resolve() if args else REPO_ROOT, layers_file))
    print(largest_classes(Path(args[0]).resolve() if args else REPO_ROOT))
