"""``fedkit config``: every config key a run would have, with its type, default and help.

The keys come from resolving the config the command describes (the same resolution a run
does), so the core's, the task's, the plugins' and the engine's keys are all there, and
each default is the value the run would use (task defaults and ``auto`` filled in).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from typing import Any

from rich.console import RenderableType
from rich.padding import Padding
from rich.text import Text

from fedkit_core.cli.options import EngineOpt, PluginOpt, TaskOpt, console, layers_of
from fedkit_core.config import Config


def config(
    plugin: list[str] = PluginOpt,
    task: str | None = TaskOpt,
    engine: str | None = EngineOpt,
) -> None:
    """List every config key with its type, default and help (for --set and YAML files).

    Add --plugin, --task and --engine to see their keys and defaults too.
    """
    from fedkit_core.resolve import resolve_config

    cfg, _ = resolve_config(layers_of(None, plugin, task, [], engine=engine))
    for section in config_sections(cfg):
        console.print(section)
    console.print("\nset a key with `--set key=value` or in a YAML file given to --config")
    console.print(PRECEDENCE)


#: where a key's value comes from, the later winning: the same for every key and command
PRECEDENCE = (
    "precedence, lowest first: the defaults above < --config FILE < a runspec's own YAML "
    "(fedkit compare) < --set key=value and the flags (--rounds, --clients, --task, ...)"
)


def config_sections(cfg: Config) -> Iterator[RenderableType]:
    """A section per group of keys: the run's own, then ``task.``, ``partition.``, the
    plugins' and the engine's keys (grouped by the part before the first dot). Each key
    is one line ``key  type = default`` with its help indented below (fits 80 columns)."""
    names = {
        "": "run",
        "task": f"task {cfg['task.name']}",
        "partition": "partition",
        **{p: f"plugin {p}" for p in cfg["plugins"]},
        cfg["engine"]: f"engine {cfg['engine']}",
    }
    order = list(names)

    def group(key: str) -> str:
        return key.split(".", 1)[0] if "." in key else ""

    def rank(key: str) -> tuple[int, str]:
        prefix = group(key)
        return (order.index(prefix) if prefix in order else len(order), prefix)

    for prefix, members in groupby(sorted(cfg.options, key=rank), key=group):
        yield Text(f"\n{names.get(prefix, prefix)}", style="bold underline")
        for key in members:
            option = cfg.options[key]
            yield Text.assemble(
                ("  " + key, "bold"), "  ", (option.describe(), "cyan"), f" = {_yaml(cfg[key])}"
            )
            if option.help:
                yield Padding(Text(option.help, style="dim"), (0, 0, 0, 6), expand=False)


def _yaml(value: Any) -> str:
    """``value`` as written after ``--set key=`` or in a YAML file."""
    if isinstance(value, list):
        return "[" + ", ".join(map(_yaml, value)) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value) if value != "" else '""'
