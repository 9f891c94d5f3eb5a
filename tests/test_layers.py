"""The core's modules import one another without cycles, and the API reaches engines only
through the registry (engines are peers, none special to ``api``)."""

import ast
from pathlib import Path

from fedkit_core.testing import REPO_ROOT

PACKAGE = REPO_ROOT / "fedkit_core"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The fedkit_core modules ``path`` imports when it is imported (module level, outside
    ``if TYPE_CHECKING``)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known}
    return found - {module_name(path)}


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports(path, set(paths)) for name, path in paths.items()}


def test_no_import_cycles():
    edges = graph()
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        assert name not in trail, "import cycle: " + " -> ".join([*trail, name])
        if name in done:
            return
        for other in sorted(edges[name]):
            visit(other, [*trail, name])
        done.add(name)

    for name in sorted(edges):
        visit(name, [])


def test_api_reaches_engines_only_through_the_registry():
    edges = graph()
    engines = {
        n
        for n in edges
        if n.startswith(("fedkit_core.engines.local", "fedkit_core.engines.flower"))
    }
    assert not edges["fedkit_core.api"] & engines
    assert not [n for n in engines if "fedkit_core.api" in edges[n]]
