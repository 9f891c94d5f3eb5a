"""The ``fedkit`` commands: run, resume, compare, report, plugins, tasks, data, config,
flower; installed plugins add theirs (``fedkit_register_commands``, e.g. fedkit-priors'
``prior`` and ``knowledge``)."""

from __future__ import annotations

from pathlib import Path

import typer

from fedkit_core.cli import config_cmd
from fedkit_core.cli.flower import flower_app
from fedkit_core.cli.options import (
    ClientsOpt,
    ConfigOpt,
    DeviceOpt,
    EngineOpt,
    FiguresOpt,
    LoggerOpt,
    PluginOpt,
    PrivateOpt,
    QuietOpt,
    RoundsOpt,
    SeedOpt,
    SetOpt,
    TaskOpt,
    console,
    finish,
    layers_of,
    observe,
    parse_formats,
    resume_hint,
)
from fedkit_core.cli.plugin_commands import PluginCommandsGroup
from fedkit_core.config import load_yaml, parse_sets

app = typer.Typer(
    help="fedkit: run, compare and reproduce federated learning methods on medical images.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=PluginCommandsGroup,
)
app.add_typer(flower_app, name="flower")


@app.command()
def run(
    plugin: list[str] = PluginOpt,
    task: str | None = TaskOpt,
    config: Path | None = ConfigOpt,
    set_: list[str] = SetOpt,
    rounds: int | None = RoundsOpt,
    clients: int | None = ClientsOpt,
    seed: int | None = SeedOpt,
    engine: str | None = EngineOpt,
    device: str | None = DeviceOpt,
    out: Path | None = typer.Option(
        None, "--out", "-o", help="run directory (default runs/<name>-<time>)"
    ),
    quiet: bool = QuietOpt,
    logger: list[str] = LoggerOpt,
    private: bool = PrivateOpt,
    figure_formats: str | None = FiguresOpt,
) -> None:
    """Run one federation. With no arguments: FedAvg on the built-in synthetic task.

    Every config key, with its type and default: `fedkit config [--plugin NAME] [--task NAME]`.
    """
    from fedkit_core.results.figure_process import drawing_in_background

    with drawing_in_background():  # first: the figure process forks before torch is imported
        from fedkit_core import api
        from fedkit_core.resolve import resolve_config
        from fedkit_core.results.store import default_out, remove_unstarted

        layers = layers_of(
            config,
            plugin,
            task,
            set_,
            rounds=rounds,
            clients=clients,
            seed=seed,
            engine=engine,
            device=device,
            private=private or None,
            figure_formats=parse_formats(figure_formats),
        )
        cfg, plugin_set = resolve_config(layers)
        named = out is None  # a folder of our own making: removed if the run fails before round 1
        out = out or default_out(cfg)
        resume_hint[0] = f"continue the run with `fedkit resume {out}`"
        try:
            with observe(quiet, "rounds", logger, out) as observer:
                results = api.run_resolved(cfg, plugin_set, out=out, observer=observer)
        except Exception:
            if named:
                remove_unstarted(out)
            raise
        finish(results, out, quiet)


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="the run directory to continue"),
    quiet: bool = QuietOpt,
    logger: list[str] = LoggerOpt,
    accept_edits: bool = typer.Option(
        False,
        "--accept-edits",
        help="continue although config.yaml was edited since the start (recorded in "
        "config-edits.log)",
    ),
    rounds: int | None = typer.Option(
        None,
        "--rounds",
        min=1,
        help="extend the run, complete or not, to this many rounds (e.g. until it converges)",
    ),
    accept_unverified: bool = typer.Option(
        False,
        "--accept-unverified",
        help="continue from checkpoint files without digests (a run of an older fedkit; "
        "recorded in results.json)",
    ),
) -> None:
    """Continue an interrupted run from its last completed round, or extend a run."""
    from fedkit_core.results.figure_process import drawing_in_background

    with drawing_in_background():  # first: the figure process forks before torch is imported
        from fedkit_core import api

        resume_hint[0] = f"continue the run with `fedkit resume {run_dir}`"
        with observe(quiet, "rounds", logger, run_dir) as observer:
            results = api.resume(
                run_dir,
                observer=observer,
                accept_edits=accept_edits,
                rounds=rounds,
                accept_unverified=accept_unverified,
            )
        finish(results, run_dir, quiet)


@app.command()
def compare(
    runspecs: list[str] = typer.Argument(
        ..., help="plugin names, combinations a+b, or YAML configs"
    ),
    seeds: str = typer.Option("0,1,2", "--seeds", help="comma-separated seeds"),
    task: str | None = TaskOpt,
    config: Path | None = ConfigOpt,
    set_: list[str] = SetOpt,
    rounds: int | None = RoundsOpt,
    clients: int | None = ClientsOpt,
    engine: str | None = EngineOpt,
    device: str | None = DeviceOpt,
    out: Path = typer.Option(Path("runs/compare"), "--out", "-o", help="output directory"),
    jobs: int = typer.Option(
        1,
        "--jobs",
        "-j",
        help="runs at once, each in its own process with cores/jobs torch threads "
        "(last digits can differ from a serial run's)",
    ),
    executor: str = typer.Option(
        "local",
        "--executor",
        help="where the runs run: local (this machine, --jobs at once) or ray (one Ray task "
        "per run on the cluster at --address; runs on storage every node sees, docs/engines.md)",
    ),
    address: str | None = typer.Option(
        None, "--address", help="the Ray cluster's head, HOST:PORT (with --executor ray)"
    ),
    reference: str | None = typer.Option(
        None,
        "--reference",
        help="the runspec each runspec's per-client gain is measured against (default: solo "
        "when compared, else the first runspec)",
    ),
    allow_unpaired: bool = typer.Option(
        False,
        "--allow-unpaired",
        help="compare runspecs that differ in task, data, clients or partition (refused "
        "otherwise: their seeds are not pairs), with a warning in the tables",
    ),
    quiet: bool = QuietOpt,
    logger: list[str] = LoggerOpt,
    private: bool = PrivateOpt,
    sites: Path | None = typer.Option(
        None,
        "--sites",
        help="site profiles (YAML, e.g. examples/sites/rural.yaml) for every run: simulated "
        "time per round (same as --set sites=PATH)",
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="also the time each run takes to reach a score, e.g. final.global.bacc=0.80 "
        "(test split; val.global.bacc=... for validation): per runspec, seeds reaching it, "
        "mean time and paired intervals, and the score against time (compare-time.png); "
        "a test-split target scores the test split every round (eval_test=every)",
    ),
    figure_formats: str | None = FiguresOpt,
) -> None:
    """Run several methods on the same task, partition and seeds; tabulate mean ± std and,
    with >= 2 seeds, each one's paired difference to the first (95% CI, wins/ties/losses),
    and per client each one's paired gain over a reference (solo: each client alone).

    The runspec `pooled` is the pooled reference: one model trained centrally on the union
    of the clients' training data (not federated), with the federation's number of steps;
    `solo` is the local reference. Both are marked as references in tables and figures.

    Precedence, the same for every key: command-line flags and --set, then a runspec's own
    YAML file, then --config, then the defaults."""
    from fedkit_core import api
    from fedkit_core.cli.display import print_rows
    from fedkit_core.comparison import compare, executor_for
    from fedkit_core.errors import FedkitError
    from fedkit_core.fileio import make_folder
    from fedkit_core.results import compare as cmp
    from fedkit_core.results.convergence import convergence_note
    from fedkit_core.results.labels import metric_name

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise FedkitError(f"--seeds expects comma-separated integers, got {seeds!r}") from None
    if not seed_list:
        raise FedkitError("--seeds is empty; give at least one seed, e.g. --seeds 0,1,2")
    runner = executor_for(executor, jobs, address)
    if runner is not None and logger:
        raise FedkitError("--logger tracks runs of this process: use it without --jobs or ray")
    # one precedence for every flag: flags and --set above the runspec files, above
    # --config, above the defaults (flags are the top layer, as in `fedkit run`)
    base = [load_yaml(config) if config else {}]
    flags = {
        "task.name": task,
        "rounds": rounds,
        "clients": clients,
        "engine": engine,
        "device": device,
        "private": private or None,
        "sites": None if sites is None else str(sites),
        "figure_formats": parse_formats(figure_formats),
    }
    sets = {**parse_sets(set_), **{k: v for k, v in flags.items() if v is not None}}
    if target is not None:
        from fedkit_core.results.timing import parse_target

        if parse_target(target).tests:  # every round's test score, for the first to reach it
            base.append({"eval_test": "every"})  # above the --config file
    total = len(runspecs) * len(seed_list)
    counter = iter(range(1, total + 1))
    resume_hint[0] = "run the same `fedkit compare` command again: finished runs are reused"

    def run_one(layers, path, spec, seed):
        title = f"[{next(counter)}/{total}] {spec} seed {seed}"
        with observe(quiet, title, logger, path) as observer:
            return api.run(layers, out=path, observer=observer, reuse=True)

    def on_done(spec, seed):
        if not quiet:
            console.print(f"[{next(counter)}/{total}] {spec} seed {seed} done")

    if private:  # the summary too, not only each run
        make_folder(out)
        out.chmod(0o700)
    found = compare(
        runspecs,
        seeds=seed_list,
        out=out,
        base=base,
        sets=sets,
        run_one=run_one,
        jobs=jobs,
        executor=runner,
        on_done=on_done,
        reference=reference,
        target=target,
        allow_unpaired=allow_unpaired,
    )
    for warning in found.warnings:
        console.print(f"[yellow]warning: not paired: {warning}[/]")
    for warning in found.environments:
        console.print(f"[yellow]warning: {cmp.ENVIRONMENTS_DIFFER}: {warning}[/]")
    if found.reused:  # said even with --quiet: these numbers were not computed now
        console.print(
            f"reused {found.reused} of {total} runs, found finished in {out} with the same "
            f"config (not run again; delete a run's folder to run it anew)"
        )
    if not quiet:
        seeds_text = ", ".join(map(str, found.seeds))
        print_rows(console, found.rows(), f"mean ± std over seeds {seeds_text}, last round")
        if found.references:
            console.print(cmp.references_note(found.references))
        if found.convergence:
            console.print(convergence_note(found.convergence))
        if found.diff:
            print_rows(console, found.diff_rows(), cmp.diff_note(runspecs[0], found.seeds))
        metric = metric_name(found.clients.get("metric", found.main), short=True)
        if found.client_rows():
            print_rows(console, found.client_rows(), f"test {metric} per client")
        if found.gain_rows():
            title = f"gain in test {metric} over {found.clients['reference']} per client"
            print_rows(console, found.gain_rows(), title)
            for note in found.clients["notes"]:
                console.print(note)
    if found.target is not None:
        from fedkit_core.results.timing import target_note, target_rows

        print_rows(console, target_rows(found.target), target_note(found.target))
        console.print(f"score against time: [bold]{out / 'compare-time.png'}[/]")
    if not found.written:
        console.print(f"[yellow]note: {out} is read-only: the comparison was not written")
        return
    figures = "figures compare" + (" and compare-clients" if found.gain_rows() else "")
    console.print(
        f"comparison of {len(found.table)} runspecs in [bold]{out}[/] "
        f"(compare.json, compare.md and compare.tex to paste, {figures})"
    )


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="one or more run directories"),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="overlay figure when several runs (default report.png in their common folder)",
    ),
    figure_formats: str | None = typer.Option(
        None,
        "--figure-formats",
        help="figure formats, comma-separated: png, pdf, svg (default: each run's "
        "figure_formats, png unless the run asked for more)",
    ),
) -> None:
    """Re-plot and summarise one or several runs."""
    from fedkit_core.cli.display import print_rows, print_run
    from fedkit_core.results.report import readable
    from fedkit_core.results.report import report as make_report
    from fedkit_core.results.schema import Results

    rows, plots, notes = make_report(run_dirs, out, parse_formats(figure_formats))
    if len(run_dirs) == 1:  # one run: its per-client table and summary
        results = Results.load(run_dirs[0])
        readable(run_dirs[0], print_run, console, results)
    else:
        print_rows(console, rows, "final round; clients: mean of the clients' test sets")
    for path in plots:
        console.print(f"plot: {path}")
    for note in notes:
        console.print(f"[yellow]note: {note}")


@app.command()
def plugins() -> None:
    """List built-in and installed plugins, their versions and the hooks they implement."""
    from rich.table import Table

    from fedkit_core.plugin_manager import list_plugins

    table = Table(title="fedkit plugins", title_justify="left")
    for column in ("name", "version", "source", "hooks"):
        table.add_column(column, overflow="fold")  # wrapped, never cut with an ellipsis
    for info in list_plugins():
        table.add_row(
            info.name,
            info.version,
            info.source,
            ", ".join(h.removeprefix("fedkit_") for h in info.hooks),
        )
    console.print(table)


@app.command()
def tasks() -> None:
    """List the tasks, their expected task.path and whether their data is present."""
    from rich.markup import escape
    from rich.table import Table

    from fedkit_core.tasks.registry import all_tasks

    table = Table(title="fedkit tasks", title_justify="left", expand=True)
    table.add_column("name", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("description (and task.path)", ratio=1, overflow="fold")  # wrapped, not cut
    table.add_column("data", overflow="fold")
    home = str(Path.home())
    for spec in all_tasks().values():
        path = spec.resolve_path(None)
        presets = f" (partition.preset: {', '.join(spec.partitions)})" if spec.partitions else ""
        text = escape(spec.description + presets)
        if path:
            text += f"\n[dim]{escape(path.replace(home, '~', 1))}[/dim]"
        table.add_row(
            spec.name,
            "seg" if spec.kind == "segmentation" else "class",
            text,
            spec.data_status(path),
        )
    console.print(table)


@app.command()
def data(
    plugin: list[str] = PluginOpt,
    task: str | None = TaskOpt,
    config: Path | None = ConfigOpt,
    set_: list[str] = SetOpt,
    clients: int | None = ClientsOpt,
    seed: int | None = SeedOpt,
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="folder, or image path, of the heatmap (default runs/data-<task>-<time>/)",
    ),
    figure_formats: str | None = FiguresOpt,
) -> None:
    """Show how the task's data is split into clients (class counts) and save a heatmap."""
    from fedkit_core.cli.display import print_rows
    from fedkit_core.federation import prepare
    from fedkit_core.resolve import resolve_config
    from fedkit_core.results.plots import figure_target, plot_partition
    from fedkit_core.results.store import default_out

    formats = parse_formats(figure_formats)
    layers = layers_of(
        config, plugin, task, set_, clients=clients, seed=seed, figure_formats=formats
    )
    cfg, plugin_set = resolve_config(layers)
    target = figure_target(out, "partition") if out else None  # checked before loading data
    fed = prepare(cfg, plugin_set)
    path = target or figure_target(default_out({"name": f"data-{cfg['task.name']}"}), "partition")
    names = fed.task.class_names
    rows = [
        {
            "client": cid,
            "train": c.num_train,
            "val": c.num_val,
            "test": c.num_test,
            **dict(zip(names, c.class_counts)),
        }
        for cid, c in fed.infos.items()
    ]
    unit = "pixels" if fed.task.kind == "segmentation" else "samples"
    print_rows(console, rows, f"{cfg['task.name']}: training {unit} per class and client")
    formats = cfg["figure_formats"]
    console.print(f"heatmap: {plot_partition(fed.task, fed.infos, path, formats)}")
    if len(formats) > 1:
        console.print(f"(also as {', '.join(formats[1:])} beside it)")


app.command()(config_cmd.config)
