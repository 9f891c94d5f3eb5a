"""Terminal output: a live progress display of rounds and tables of results."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedkit_core.contract.observer import Observer
from fedkit_core.results.schema import ACTIVATION, has_test


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


class RoundTimer:
    """How long the rest of a run should take, from the rounds timed so far. Round 1 holds
    the start-up (building the model, reading data, the first batches' warm-up), so the
    estimate rests on the later, steady rounds as soon as there are two, with their spread
    as its uncertainty; from round 1 alone it is a range, as wide as such first estimates
    were seen to miss (0.6-1.7 times)."""

    #: how far an estimate from round 1 alone was seen to miss, both ways
    FIRST_ROUND_RANGE = (0.6, 1.7)

    def __init__(self, total: int):
        self.total = total
        self.seconds: list[float] = []

    def add(self, seconds: float) -> None:
        self.seconds.append(seconds)

    @property
    def steady(self) -> list[float]:
        """The rounds after the first (the start-up), once there are two of them."""
        return self.seconds[1:] if len(self.seconds) >= 3 else []

    def left(self) -> tuple[float, float, float]:
        """``(estimate, low, high)`` seconds for the rounds left."""
        rounds_left = self.total - len(self.seconds)
        if self.steady:
            per = statistics.median(self.steady)
            spread = statistics.pstdev(self.steady) * rounds_left  # slow drifts add up, not cancel
            return (
                per * rounds_left,
                max(per * rounds_left - spread, 0.0),
                per * rounds_left + spread,
            )
        per = statistics.fmean(self.seconds)
        low, high = self.FIRST_ROUND_RANGE
        return per * rounds_left, per * rounds_left * low, per * rounds_left * high

    def eta(self) -> str:
        """``~1 min 20 s left (± 10 s)`` for the progress display; empty once done."""
        if len(self.seconds) >= self.total or not self.seconds:
            return ""
        mid, low, high = self.left()
        if self.steady:
            return f"~{duration(mid)} left (± {duration((high - low) / 2)})"
        return f"~{duration(mid)} left ({duration(low)}-{duration(high)})"

    def announcement(self) -> str | None:
        """What to print once after round 1 (the whole run's expected time, as a range) and
        after round 3 (from the steady rounds, with their spread); else None."""
        n = len(self.seconds)
        if n == 1 and self.total > 1:
            mid, low, high = (self.seconds[0] + x for x in self.left())
            return (
                f"round 1 took {duration(self.seconds[0])} (start-up included): expect about "
                f"{duration(mid)} for {self.total} rounds, likely {duration(low)} to "
                f"{duration(high)}" + ("; refined after round 3" if self.total > 3 else "")
            )
        if n == 3 and self.total > 3:
            mid, low, high = (sum(self.seconds) + x for x in self.left())
            per, spread = statistics.median(self.steady), statistics.pstdev(self.steady)
            return (
                f"rounds 2-3 took {duration(per)} each (± {duration(spread)}): expect about "
                f"{duration(mid)} for {self.total} rounds (± {duration((high - low) / 2)})"
            )
        return None


def estimate_text(round_seconds: float, rounds: int) -> str:
    """What a run should cost, said before round 1 (:meth:`Observer.on_estimate`)."""
    return (
        "before round 1: a few timed training steps suggest about "
        f"{duration(round_seconds)} a round, {duration(round_seconds * rounds)} for {rounds} "
        "rounds (the model's own work; data loading, plugins and DP add to it)"
    )


def round_text(record: Mapping[str, Any]) -> str:
    """A round's headline for the console: its main metric on the test split (pooled, or
    the clients' mean), the clients' std and worst, and a DP run's epsilon so far."""
    text = ""
    if has_test(record):
        glob, fair = record["global"] or record["clients_mean"], record.get("fairness", {})
        main = fair.get("metric") or next(iter(glob))
        text = f"{main} {glob.get(main, float('nan')):.3f}"
        if fair:
            text += f"  clients std {fair['std']:.3f} worst {fair['worst']:.3f}"
    elif "val" in record:  # eval_test=improved: test not scored this round
        val = record["val"]
        glob, main = val["global"] or val["clients_mean"], val["fairness"].get("metric")
        main = main or next(iter(glob), None)
        if main is not None:
            text = f"val {main} {glob.get(main, float('nan')):.3f} (test scored for the best round)"
    privacy = record.get("privacy")
    if privacy is not None:
        text += f"  ε {privacy['epsilon']:.3f}"
    return text


def privacy_spent(record: Mapping[str, Any]) -> str | None:
    """A DP round's line on the budget spent so far (printed every round), else None."""
    privacy = record.get("privacy")
    if privacy is None:
        return None
    return (
        f"round {record['round']}: privacy spent ε = {privacy['epsilon']:.4f} "
        f"at δ = {privacy['delta']:g}"
    )


class RichProgress(Observer):
    """Rounds as a progress bar, the current phase (train, query, evaluate) below it, and
    the latest metrics next to the bar. From the first round on, the bar also says how long
    the rest of the run should take (:class:`RoundTimer`: from the steady rounds, with its
    uncertainty), and rounds 1 and 3 print the whole run's expected wall time once, so a
    long run is known to be long in its first minute."""

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
        self.last = 0.0
        self.timer = RoundTimer(0)

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    wants_estimate = True

    def on_estimate(self, round_seconds: float, rounds: int) -> None:
        self.progress.console.print(estimate_text(round_seconds, rounds))

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
        self.last, self.timer = self.clock(), RoundTimer(total_rounds - first_round + 1)

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None:
        if self.phase is not None:
            self.progress.update(
                self.phase,
                description=f"  round {round}: {phase}",
                total=max(total, 1),
                completed=done,
            )

    def on_round_end(self, record: dict[str, Any]) -> None:
        spent = privacy_spent(record)
        if spent:
            self.progress.console.print(spent)
        now = self.clock()
        self.timer.add(now - self.last)
        self.last = now
        said = self.timer.announcement()
        if said:
            self.progress.console.print(said)
        self.progress.update(
            self.rounds, advance=1, metrics=round_text(record), eta=self.timer.eta()
        )


class PlainProgress(Observer):
    """The progress of a run as plain lines, for output that is not a terminal (a log, a
    pipe): one line a round with its metrics and the time left, and the estimates of
    :class:`RoundTimer`; no bars, no control characters."""

    def __init__(
        self, console: Console, title: str = "", clock: Callable[[], float] = time.monotonic
    ):
        self.console = console
        self.clock = clock
        self.title = title
        self.last = 0.0
        self.total = 0
        self.timer = RoundTimer(0)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    wants_estimate = True

    def on_estimate(self, round_seconds: float, rounds: int) -> None:
        self._say(estimate_text(round_seconds, rounds))

    def on_start(self, total_rounds: int, first_round: int) -> None:
        self.total = total_rounds
        self.last, self.timer = self.clock(), RoundTimer(total_rounds - first_round + 1)
        where = f"{self.title}: " if self.title not in ("", "rounds") else ""
        self._say(f"{where}rounds {first_round}-{total_rounds} of {total_rounds}")

    def on_round_end(self, record: dict[str, Any]) -> None:
        now = self.clock()
        self.timer.add(now - self.last)
        self.last = now
        spent = privacy_spent(record)
        if spent:
            self._say(spent)
        parts = [f"round {record['round']}/{self.total}", round_text(record), self.timer.eta()]
        self._say("  ".join(p for p in parts if p))
        said = self.timer.announcement()
        if said:
            self._say(said)


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
        console.print(event_line(event), soft_wrap=True)
    privacy = final.get("privacy")
    if privacy:
        console.print(privacy_line(privacy))
    _print_time(console, results)
    console.print(f"status {results['status']}; wall time {final['wall_seconds']:.1f} s")


def event_line(event: Mapping[str, Any]) -> str:
    """An event of results.json as a line: a client's failure, or a refused second
    activation of a SuperNode's key (a deployment's warning; see docs/engines.md)."""
    if event.get("phase") == ACTIVATION:
        return f"[bold yellow]warning:[/] {event['error']}"
    return (
        f"[yellow]round {event['round']}: client {event['client']} failed in "
        f"{event['phase']}: {event['error']}"
    )


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
        table.add_column(
            str(column), justify="left" if text else "right", no_wrap=not text, overflow="fold"
        )
    for row in rows:
        table.add_row(*(_fmt(v) for v in row.values()))
    return table
