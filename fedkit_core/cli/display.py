"""Terminal output: a live progress display of rounds and tables of results."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedkit_core.contract.observer import Observer
from fedkit_core.results.schema import has_test


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else str(value)


def duration(seconds: float) -> str:
    """``seconds`` for people: ``42 s``, ``3 min 20 s``, ``2 h 05 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class RichProgress(Observer):
    """Rounds as a progress bar, the current phase (train, query, evaluate) below it, and
    the latest metrics next to the bar. From the first round on, the bar also says how long
    the rest of the run should take (the mean round so far times the rounds left), and the
    first round prints the whole run's expected wall time once, so a long run is known to be
    long in its first minute."""

    def __init__(
        self, console: Console, title: str = "", clock: Callable[[], float] = time.monotonic
    ):
        self.console = console
        self.clock = clock
        self.title = title
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            TextColumn("{task.fields[metrics]}"),
            console=console,
            transient=False,
        )
        self.rounds = None
        self.phase = None
        self.started = 0.0
        self.done = 0
        self.total = 0

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_start(self, total_rounds: int, first_round: int) -> None:
        if self.rounds is not None:
            self.progress.remove_task(self.rounds)
            self.progress.remove_task(self.phase)
        self.rounds = self.progress.add_task(
            self.title or "rounds",
            total=total_rounds,
            completed=first_round - 1,
            metrics="",
            eta="",
        )
        self.phase = self.progress.add_task("  starting", total=1, metrics="", eta="")
        self.started, self.done, self.total = self.clock(), 0, total_rounds - first_round + 1

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None:
        if self.phase is not None:
            self.progress.update(
                self.phase,
                description=f"  round {round}: {phase}",
                total=max(total, 1),
                completed=done,
            )

    def on_round_end(self, record: dict[str, Any]) -> None:
        text = ""
        if has_test(record):
            glob, fair = record["global"] or record["clients_mean"], record.get("fairness", {})
            main = fair.get("metric") or next(iter(glob))
            text = f"{main} {glob.get(main, float('nan')):.3f}"
            if fair:
                text += f"  clients std {fair['std']:.3f} worst {fair['worst']:.3f}"
        elif "val" in record:  # eval_test=improved: validation did not improve, no test
            val = record["val"]
            glob, main = val["global"] or val["clients_mean"], val["fairness"].get("metric")
            main = main or next(iter(glob), None)
            if main is not None:
                text = f"val {main} {glob.get(main, float('nan')):.3f} (no better: test not scored)"
        privacy = record.get("privacy")
        if privacy is not None:  # differential privacy: the budget spent so far, every round
            text += f"  ε {privacy['epsilon']:.3f}"
            self.progress.console.print(
                f"round {record['round']}: privacy spent ε = {privacy['epsilon']:.4f} "
                f"at δ = {privacy['delta']:g}"
            )
        self.done += 1
        per_round = (self.clock() - self.started) / self.done
        left = per_round * (self.total - self.done)
        eta = f"~{duration(left)} left" if self.done < self.total else ""
        if self.done == 1 and self.total > 1:
            self.progress.console.print(
                f"round 1 took {duration(per_round)}: expect about "
                f"{duration(per_round * self.total)} for {self.total} rounds"
            )
        self.progress.update(self.rounds, advance=1, metrics=text, eta=eta)


#: shorter column headings for the console (results.json keeps the full names)
_SHORT = {"f1_macro": "f1", "head_acc": "head", "medium_acc": "medium", "tail_acc": "tail"}


def results_table(results: Mapping[str, Any], title: str) -> Table:
    """Final metrics of a run: global, clients mean and each client."""
    final = results["final"]
    metrics = list(final.get("global") or final.get("clients_mean", {}))
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("scope")
    for m in metrics:
        table.add_column(_SHORT.get(m, m), justify="right")
    rows = [
        ("global (pooled test)", final.get("global", {})),
        ("clients mean", final.get("clients_mean", {})),
    ]
    rows += [(f"  {cid}", m) for cid, m in final.get("clients", {}).items()]
    for name, values in rows:
        table.add_row(name, *(_fmt(values.get(m)) for m in metrics))
    return table


def print_run(console: Console, results: Mapping[str, Any]) -> None:
    """A finished (or interrupted) run: its table, fairness, best round, failures, time."""
    final = results["final"]
    main = results["task"]["main_metric"]
    if results.get("reference"):  # not a method: say so before any number
        console.print(f"[bold]{results['reference']['about']}[/]")
    console.print(results_table(results, f"final metrics (round {final['round']})"))
    fair, best = final.get("fairness", {}), final.get("best", {})
    if fair:
        console.print(
            f"fairness ({main}): std {fair['std']:.4f}, worst {fair['worst']:.4f} "
            f"(client {fair['worst_client']})"
        )
    if best:
        scope = best.get("scope", "global")
        console.print(
            f"best round on validation: {best['round']} "
            f"(test {main} {best[scope].get(main, float('nan')):.4f}, {scope})"
        )
    traffic = final.get("bytes")
    if traffic and results["rounds"]:
        per_round = {k: v / len(results["rounds"]) for k, v in traffic.items()}
        console.print(
            f"traffic: {_megabytes(traffic['down'])} down, {_megabytes(traffic['up'])} up "
            f"({_megabytes(per_round['down'])} / {_megabytes(per_round['up'])} per round, "
            "all clients)"
        )
    for warning in results.get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {warning}")
    for event in results.get("events", []):
        console.print(
            f"[yellow]round {event['round']}: client {event['client']} failed in "
            f"{event['phase']}: {event['error']}"
        )
    privacy = final.get("privacy")
    if privacy:
        console.print(privacy_line(privacy))
    _print_time(console, results)
    console.print(f"status {results['status']}; wall time {final['wall_seconds']:.1f} s")


def privacy_line(privacy: Mapping[str, Any]) -> str:
    """A DP run's guarantee in one line: level, (epsilon, delta), noise and how it ended."""
    sigma = privacy.get("noise_multiplier")
    noise = f", noise multiplier {sigma:.4g}" if isinstance(sigma, float) else ""
    how = ""
    if privacy.get("target_epsilon") is not None:
        how = f"; target ε {privacy['target_epsilon']:g}: " + (
            "noise calibrated before training"
            if privacy.get("on_target") == "calibrate"
            else f"stopped after round {privacy['rounds_run']} of {privacy['rounds_planned']}"
        )
    line = (
        f"privacy ({privacy['level']}-level DP, {privacy['accountant']}): "
        f"ε = {privacy['epsilon']:.4f} at δ = {privacy['delta']:g}{noise}{how}"
    )
    if privacy.get("noise_secret") is False:  # dp.reproducible_noise: tests only
        line = f"[bold red]{privacy['noise']}[/]\n{line}"
    return line


def _print_time(console: Console, results: Mapping[str, Any]) -> None:
    """Simulated time (site profiles, aggregation modes) and the outages that delayed work."""
    simulated = results["final"].get("simulated_seconds")
    if simulated is None:
        return
    outages = [(r["round"], o) for r in results["rounds"] for o in r.get("outages", [])]
    for rnd, o in outages[:10]:
        console.print(
            f"[yellow]round {rnd}: {o['client']} was down from {clock_text(o['from'])} "
            f"to {clock_text(o['to'])}; its work waited {clock_text(o['waited'])}"
        )
    if len(outages) > 10:
        console.print(f"[yellow]... and {len(outages) - 10} more outages (rounds' `outages`)")
    mode = results["config"].get("aggregation", "sync")
    console.print(f"simulated time {clock_text(simulated)} (aggregation {mode})")


def clock_text(seconds: float) -> str:
    """Simulated time for people: ``1.5 s``, ``4 min 12 s``, ``1 h 15 min 21 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    return " ".join(([f"{hours} h"] if hours else []) + [f"{minutes} min", f"{secs} s"])


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def print_rows(console: Console, rows: Sequence[Mapping[str, Any]], title: str = "") -> None:
    """Print ``rows`` as :func:`rows_table`, in several tables when their columns do not fit
    the console side by side (e.g. a comparison of many runspecs): each table repeats the
    first column and takes as many of the others as fit, so no number is cut off."""
    if not rows:
        return
    columns = list(rows[0])

    def width(column: str) -> int:
        return max(len(str(column)), *(len(_fmt(r.get(column))) for r in rows)) + 2

    groups: list[list[str]] = []
    room = console.width - 2 - width(columns[0])  # the table's edges
    for column in columns[1:]:
        if not groups or sum(map(width, groups[-1])) + width(column) > room:
            groups.append([])
        groups[-1].append(column)
    for n, group in enumerate(groups or [[]]):
        part = [{c: r.get(c) for c in (columns[0], *group)} for r in rows]
        more = f" ({n + 1}/{len(groups)})" if len(groups) > 1 else ""
        console.print(rows_table(part, title + more if title else more.strip()))


def rows_table(rows: Sequence[Mapping[str, Any]], title: str = "") -> Table:
    """One row per mapping; text columns wrap, numbers never do."""
    table = Table(
        title=title or None, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0)
    )
    for column in rows[0]:
        text = column in ("run", "status", "name", "metric", "client")
        table.add_column(str(column), justify="left" if text else "right", no_wrap=not text)
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    return table
