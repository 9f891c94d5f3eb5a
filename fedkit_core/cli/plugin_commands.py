"""Commands that installed plugins add to ``fedkit`` (the ``fedkit_register_commands`` hook).

The ``fedkit`` group holds the core's commands. A package adds commands by naming the module
that implements the hook under the entry-point group ``fedkit.commands`` (not the method
plugins' ``fedkit.plugins``), so listing them (``fedkit --help``) imports those modules only,
not every installed method and torch with it. They are imported only when a command the core
lacks is asked for or when ``fedkit --help`` lists them all; a module that fails to import,
or whose hook fails, costs only its own commands, with one warning.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import click
import pluggy
import typer
from rich.text import Text
from typer.core import TyperGroup

from fedkit_core.cli.options import err_console
from fedkit_core.hooks import hookspecs

#: the entry-point group of the modules that add commands (``fedkit_register_commands``)
COMMANDS_GROUP = "fedkit.commands"


class PluginCommandsGroup(TyperGroup):
    """The ``fedkit`` group: the core's commands first, then, on demand, the plugins'."""

    _plugins_added = False

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            self._add_plugin_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def _add_plugin_commands(self) -> None:
        if self._plugins_added:
            return
        self._plugins_added = True
        for plugin, name, command in plugin_commands():
            if name in self.commands:
                warn(f"plugin {plugin!r}'s command {name!r} is ignored: fedkit has one so named")
                continue
            self.add_command(command, name)


def plugin_commands() -> list[tuple[str, str, click.Command]]:
    """``(entry-point name, command name, command)`` for every command the modules of
    :data:`COMMANDS_GROUP` register, in their entry-point names' order."""
    pm = pluggy.PluginManager("fedkit")
    pm.add_hookspecs(hookspecs)
    for entry_point in sorted(entry_points(group=COMMANDS_GROUP), key=lambda ep: ep.name):
        name = entry_point.name
        try:
            plugin = entry_point.load()
            if not pm.is_registered(plugin):
                pm.register(plugin, name=name)
        except Exception as err:
            warn(f"commands {name!r} ({entry_point.value}) cannot be loaded, {_missing(err)}")
    found = []
    for impl in pm.hook.fedkit_register_commands.get_hookimpls():  # registration order
        app = typer.Typer()
        try:
            impl.function(cli=app)
            commands = typer.main.get_group(app).commands
        except Exception as err:
            warn(f"plugin {impl.plugin_name!r} failed to add its commands, {_missing(err)}")
            continue
        found += [(impl.plugin_name, name, command) for name, command in commands.items()]
    return found


def _missing(err: Exception) -> str:
    return f"so its commands are missing: {type(err).__name__}: {err}"


def warn(message: str) -> None:
    err_console.print(Text.assemble(("warning: ", "bold yellow"), message), soft_wrap=True)
