"""Bundled plugins use fedkit only through its public plugin surface.

A plugin imports ``fedkit_core`` or ``fedkit_core.plugin`` and nothing deeper, so the core's
internal modules can move without breaking third-party plugins written like these.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the plugin API, and the results API for tools that read runs and comparisons (FCA's table)
PUBLIC = {"fedkit_core", "fedkit_core.plugin", "fedkit_core.results"}
SOURCES = sorted(
    path
    for package in [*ROOT.glob("plugins/*/fedkit_*"), *ROOT.glob("examples/plugin-*/fedkit_*")]
    for path in package.rglob("*.py")
)


def fedkit_imports(path: Path) -> list[str]:
    """Every ``fedkit_core...`` module a source file imports (at any depth of the file)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            if node.module == "fedkit_core":  # `from fedkit_core import plugins` is deeper
                found += [f"fedkit_core.{alias.name}" for alias in node.names]
    return [name for name in found if name.split(".")[0] == "fedkit_core"]


def test_there_are_plugin_sources_to_check():
    assert len(SOURCES) >= 10


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_public_surface(path):
    import fedkit_core

    deeper = [
        name
        for name in fedkit_imports(path)
        if name not in PUBLIC and name.removeprefix("fedkit_core.") not in fedkit_core.__all__
    ]
    assert not deeper, f"{path.name} imports fedkit internals {deeper}; use fedkit_core.plugin"


def test_the_checker_catches_an_internal_import(tmp_path):
    source = tmp_path / "bad.py"
    source.write_text("from fedkit_core.contract.context import derive_seed\nimport fedkit_core\n")
    assert fedkit_imports(source) == ["fedkit_core.contract.context", "fedkit_core"]
