"""Engines are peers behind one interface: built-ins and installed engines alike are found
by name in the registry, add their own options and receive the resolved config."""

from importlib.metadata import EntryPoint

import pytest

from fedkit_core import FedkitError, Option, resolve_config, run
from fedkit_core.engines import registry
from fedkit_core.engines.base import Engine
from fedkit_core.engines.local import ENGINE as LOCAL
from fedkit_core.results.schema import Results
from fedkit_core.testing import tiny


class EchoEngine:
    """A third-party engine: records what it was given instead of training."""

    options = (Option("speed", int, 1, "how fast"),)

    def __init__(self):
        self.calls = []

    def execute(self, cfg, plugins, run_dir, observer, resume):
        self.calls.append((cfg, run_dir, resume))
        return Results({"status": "complete", "config": cfg.nested()})


ECHO = EchoEngine()


@pytest.fixture
def installed(monkeypatch):
    """Entry points of group fedkit.engines: the echo engine and a broken one."""
    eps = {
        "echo": EntryPoint("echo", f"{__name__}:ECHO", registry.ENTRY_POINT_GROUP),
        "broken": EntryPoint("broken", "os:sep", registry.ENTRY_POINT_GROUP),
        "local": EntryPoint("local", "os:sep", registry.ENTRY_POINT_GROUP),  # may not shadow
    }
    monkeypatch.setattr(registry, "installed_engines", lambda: eps)
    ECHO.calls.clear()


def test_built_in_engines_implement_the_engine_interface():
    for name in registry.BUILTIN_ENGINES:
        assert isinstance(registry.get_engine(name), Engine)


def test_an_unknown_engine_is_named_with_close_matches():
    with pytest.raises(FedkitError, match="unknown engine 'flowr'. Did you mean 'flower'"):
        resolve_config(tiny(engine="flowr"))


def test_an_installed_engine_runs_the_resolved_config_with_its_options(installed, tmp_path):
    results = run(tiny(engine="echo", echo={"speed": 3}), out=tmp_path / "run")
    ((cfg, run_dir, resume),) = ECHO.calls
    assert cfg["echo.speed"] == 3 and cfg["model"] == "cnn"  # resolved: auto values filled
    assert run_dir.path == tmp_path / "run" and run_dir.is_run() and resume is False
    assert results["config"]["engine"] == "echo"
    cfg, _ = resolve_config(tiny())
    assert cfg.options["engine"].choices == ("local", "flower", "echo", "broken")


def test_engine_options_are_valid_only_for_their_engine(installed):
    with pytest.raises(FedkitError, match="echo"):
        resolve_config(tiny(echo={"speed": 3}))


def test_an_entry_point_that_is_not_an_engine_is_a_clear_error(installed):
    assert registry.get_engine("local") is LOCAL  # the built-in wins over the entry point
    with pytest.raises(FedkitError, match="'broken' of group fedkit.engines .* is not an engine"):
        registry.get_engine("broken")
