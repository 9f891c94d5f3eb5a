"""Plugins add ``fedkit`` commands through ``fedkit_register_commands`` (as llm's
``register_commands``): a throwaway plugin, installed as a real distribution with an entry
point, adds its commands; the core's commands keep their names; a broken plugin costs only
its own commands; a core command never imports the installed plugins."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from fedkit_core.cli import main

PLUGIN = '''
import typer

from fedkit_core import FedkitError, hookimpl


@hookimpl
def fedkit_register_commands(cli):
    @cli.command()
    def hello(name: str = typer.Option("world", "--name", help="who to greet")):
        """Greet someone."""
        print(f"hello {name}")

    @cli.command()
    def refuse():
        """Fail as a user error."""
        raise FedkitError("refused: nothing to do")

    @cli.command()
    def run():
        """Try to replace the core's run."""
        print("not the core's run")

    greet = typer.Typer(help="Greetings.", no_args_is_help=True)

    @greet.command()
    def politely():
        print("good day")

    cli.add_typer(greet, name="greet")
'''


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """A distribution ``throwaway`` on sys.path with the plugin above and a broken one."""
    module = "fedkit_throwaway_commands"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    info = tmp_path / "fedkit_throwaway-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedkit-throwaway\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[fedkit.commands]\nthrowaway = {module}\nthrowaway-broken = fedkit_no_such_module\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    yield module
    sys.modules.pop(module, None)


def test_a_plugin_command_runs_with_its_options(throwaway, capsys):
    assert main(["hello", "--name", "fedkit"]) == 0
    assert capsys.readouterr().out == "hello fedkit\n"
    assert main(["greet", "politely"]) == 0
    assert "good day" in capsys.readouterr().out


def test_a_plugin_commands_user_error_is_one_message_and_exit_2(throwaway, capsys):
    assert main(["refuse"]) == 2
    err = capsys.readouterr().err
    assert "refused: nothing to do" in err and "Traceback" not in err


def test_help_lists_plugin_commands_and_warns_about_the_broken_and_the_shadowing(throwaway, capsys):
    assert main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert "hello" in out and "Greet someone." in out and "greet" in out
    assert "throwaway-broken" in err and "fedkit_no_such_module" in err
    assert "'throwaway''s command 'run' is ignored" in err


def test_the_core_command_wins_and_loads_no_plugin(throwaway, capsys):
    assert main(["run", "--help"]) == 0
    assert "Run one federation" in capsys.readouterr().out
    assert throwaway not in sys.modules  # a core command never imports installed plugins


def test_an_unknown_command_stays_a_readable_usage_error(throwaway, capsys):
    assert main(["helo"]) == 2
    err = capsys.readouterr().err
    assert "No such command 'helo'" in err and "Traceback" not in err


def test_help_imports_neither_torch_nor_the_method_plugins():
    """``fedkit --help`` lists the commands of the ``fedkit.commands`` modules only: the
    installed methods (``fedkit.plugins``), and torch with them, stay unimported."""
    code = (
        "import sys\n"
        "from fedkit_core.cli import main\n"
        "assert main(['--help']) == 0\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('fedkit_')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    imported = done.stdout.strip().splitlines()[-1]
    assert "'torch'" not in imported, imported
    methods = [ep.value.split(".")[0] for ep in entry_points(group="fedkit.plugins")]
    assert methods and not any(f"'{m}" in imported for m in methods), imported
