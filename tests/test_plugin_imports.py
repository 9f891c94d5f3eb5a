"""Plugins and their tests use fedkit only through its public plugin surface.

A plugin (``plugins/*``, ``examples/*``) imports ``fedkit_core.plugin`` (or a name of
``fedkit_core``'s ``__all__``: the embedding API and the building blocks of companion
packages) and nothing deeper; its tests add ``fedkit_core.testing``. So the core's internal
modules can move without breaking third-party plugins written like these.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what a plugin may import of fedkit (besides the names of ``fedkit_core.__all__``)
PUBLIC = {"fedkit_core", "fedkit_core.plugin"}
#: what a plugin's tests may import besides
FOR_TESTS = {"fedkit_core.testing"}
SOURCES = sorted(
    path for folder in ("plugins", "examples") for path in (ROOT / folder).rglob("*.py")
)


def is_test(path: Path) -> bool:
    return "tests" in path.parts or path.name.startswith(("test_", "conftest"))


def fedkit_imports(path: Path) -> list[str]:
    """Every ``fedkit_core...`` module a source file imports (at any depth of the file)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            if node.module == "fedkit_core":  # `from fedkit_core import plugin_manager` is deeper
                found += [f"fedkit_core.{alias.name}" for alias in node.names]
    return [name for name in found if name.split(".")[0] == "fedkit_core"]


def internal_imports(path: Path) -> list[str]:
    """The fedkit modules ``path`` imports beyond what it may (see the module docstring)."""
    import fedkit_core

    allowed = PUBLIC | (FOR_TESTS if is_test(path) else set())
    return [
        name
        for name in fedkit_imports(path)
        if name not in allowed and name.removeprefix("fedkit_core.") not in fedkit_core.__all__
    ]


def test_there_are_plugin_sources_and_tests_to_check():
    assert len([p for p in SOURCES if not is_test(p)]) >= 10
    assert len([p for p in SOURCES if is_test(p)]) >= 10


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_and_their_tests_import_only_the_public_surface(path):
    deeper = internal_imports(path)
    hint = "fedkit_core.plugin or fedkit_core.testing" if is_test(path) else "fedkit_core.plugin"
    assert not deeper, f"{path.name} imports fedkit internals {deeper}; use {hint}"


def test_the_checker_catches_an_internal_import(tmp_path):
    source = tmp_path / "bad.py"
    source.write_text("from fedkit_core.hooks.context import derive_seed\nimport fedkit_core\n")
    assert fedkit_imports(source) == ["fedkit_core.hooks.context", "fedkit_core"]
    assert internal_imports(source) == ["fedkit_core.hooks.context"]


def test_the_testing_helpers_are_for_tests_only(tmp_path):
    (tmp_path / "tests").mkdir()
    for path in (tmp_path / "plugin.py", tmp_path / "tests" / "test_it.py"):
        path.write_text(
            "from fedkit_core.testing import tiny\n"
            "from fedkit_core.results import RunDir\n"
            "from fedkit_core import plugin_manager, run\n"
        )
    assert internal_imports(tmp_path / "plugin.py") == [
        "fedkit_core.testing",
        "fedkit_core.results",
        "fedkit_core.plugin_manager",
    ]
    assert internal_imports(tmp_path / "tests" / "test_it.py") == [
        "fedkit_core.results",
        "fedkit_core.plugin_manager",
    ]


@pytest.mark.slow
def test_the_test_surface_resolves():
    """Every name ``fedkit_core.testing`` offers plugin tests exists where it points."""
    import fedkit_core.testing as testing

    for name in testing.TEST_SURFACE:
        assert getattr(testing, name) is not None, name
