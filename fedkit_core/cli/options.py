"""What the ``fedkit`` commands share: their options, consoles, config layers and output.

A module of its own so that every command module (``app``, ``flower``) imports it, and
none imports another.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from fedkit_core.config import load_yaml, parse_sets
from fedkit_core.errors import FedkitError

if TYPE_CHECKING:
    from fedkit_core.contract.observer import Observer

console = Console()
err_console = Console(stderr=True)

PluginOpt = typer.Option(
    [], "--plugin", "-p", help="method plugin to activate (repeatable; fedavg = none)"
)
TaskOpt = typer.Option(None, "--task", "-t", help="task name (see `fedkit tasks`)")
ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file")
SetOpt = typer.Option([], "--set", "-s", help="override a config key: key=value (repeatable)")
RoundsOpt = typer.Option(None, "--rounds", help="communication rounds")
ClientsOpt = typer.Option(None, "--clients", help="number of clients")
SeedOpt = typer.Option(None, "--seed", help="random seed")
EngineOpt = typer.Option(None, "--engine", help="local, flower or an installed engine")
DeviceOpt = typer.Option(None, "--device", help="auto, cpu, cuda, ...")
QuietOpt = typer.Option(False, "--quiet", "-q", help="no progress display")
PrivateOpt = typer.Option(
    False,
    "--private",
    help="only you may read the run folder: 0700, its files 0600 (the config key private)",
)
FiguresOpt = typer.Option(
    None,
    "--figure-formats",
    help="figure formats, comma-separated: png (the default), pdf, svg, e.g. png,pdf,svg "
    "(the config key figure_formats)",
)
LoggerOpt = typer.Option(
    [], "--logger", help="also log to tensorboard, mlflow or wandb (repeatable; docs/tracking.md)"
)


def parse_formats(text: str | None) -> tuple[str, ...] | None:
    """``--figure-formats png,pdf`` -> ``("png", "pdf")``; ``None`` when not given. Refuses
    a format fedkit does not write."""
    if text is None:
        return None
    from fedkit_core.results.plots import FORMATS

    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise FedkitError(
            f"--figure-formats takes a comma-separated list of {', '.join(FORMATS)}; got {text!r}"
        )
    return formats


def layers_of(
    config: Path | None, plugins: list[str], task: str | None, sets: list[str], **flags: Any
) -> list[dict[str, Any]]:
    """Config layers, lowest priority first: YAML file, --plugin/--task, --set, flags."""
    layers: list[dict[str, Any]] = []
    base = load_yaml(config) if config else {}
    layers.append(base)
    cli: dict[str, Any] = {}
    if plugins:
        cli["plugins"] = list(base.get("plugins") or []) + list(plugins)
    if task:
        cli["task.name"] = task
    layers.append(cli)
    layers.append(parse_sets(sets))
    layers.append({k: v for k, v in flags.items() if v is not None})
    return layers


def finish(results: dict[str, Any], out: Path, quiet: bool) -> None:
    """Show a finished run (with ``quiet`` only its directory, and on stderr the warnings
    no run may hide: a SuperNode key activated twice)."""
    from fedkit_core.cli.display import event_line, print_run
    from fedkit_core.results.schema import ACTIVATION

    if quiet:
        for event in results.get("events", []):
            if event.get("phase") == ACTIVATION:
                err_console.print(event_line(event), soft_wrap=True)
        console.print(str(out))
        return
    print_run(console, results)
    console.print(f"results in [bold]{out}[/]")


def progress(quiet: bool, title: str = ""):
    """A progress display for a run (also its observer): bars on a terminal, plain lines
    when the output is not one (a log, a pipe); nothing with ``quiet``."""
    from contextlib import nullcontext

    if quiet:  # without importing the display (rich's text and tables)
        return nullcontext(None)
    from fedkit_core.cli.display import PlainProgress, RichProgress

    return (RichProgress if console.is_terminal else PlainProgress)(console, title)


#: what an interrupted command prints to say how to continue (the commands that run set it)
resume_hint = ["continue the run with `fedkit resume RUN_DIR`"]


@contextmanager
def observe(quiet: bool, title: str, loggers: list[str], out: Path) -> Iterator[Observer]:
    """The progress display and a tracker per ``--logger`` of the run in ``out``, as one
    observer; a tracked run that an error interrupts is closed as failed."""
    from fedkit_core.tracking import Observers, make_tracker

    with ExitStack() as stack:
        trackers = [stack.enter_context(make_tracker(name, out)) for name in loggers]
        yield Observers([stack.enter_context(progress(quiet, title)), *trackers])
