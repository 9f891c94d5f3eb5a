"""Figures of a run (curves, clients), of several runs and of a comparison across seeds.

Every figure is written as PNG (to look at) and, on request (the config key
``figure_formats``, ``--figure-formats``), as PDF and SVG (for a paper: text stays text)
beside it: the three formats took three to four times as long as PNG alone, so a run writes
PNG alone by default (docs/architecture.md, "Figures").
Rounds are whole numbers, legends sit outside the data, bars start at zero with the chance
level drawn, each curve says which split it shows, and metrics carry the names a reader
knows (:mod:`fedkit_core.results.labels`). The ``draw_*`` functions return the Figure
(what tests inspect); the ``plot_*`` functions draw and save it."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.errors import FedkitError
from fedkit_core.fileio import write_atomic
from fedkit_core.results.labels import (
    chance_level,
    client_view,
    metric_name,
    run_label,
    setting_parts,
    value_range,
)
from fedkit_core.results.schema import has_test

FORMATS = ("png", "pdf", "svg")
#: what a figure is written as unless ``figure_formats`` asks for more
DEFAULT_FORMATS = ("png",)
#: fewer seeds than this draw each seed's values, not a band or an interval: the t-interval
#: of two seeds is 12.7 standard errors wide and a ± std band of two says little
MIN_SEEDS_INTERVAL = 3
#: the figures :func:`plot_run` draws in a run's folder
RUN_FIGURES = ("curves", "clients")
_METADATA = {"pdf": {"CreationDate": None}, "svg": {"Date": None}, "png": {}}  # reproducible


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"pdf.fonttype": 42, "svg.fonttype": "none", "svg.hashsalt": "fedkit"})
    return plt


def warm_up() -> None:
    """Import the plotting stack now (a figure process does it while the run trains)."""
    _pyplot()


def figure_formats(config: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The formats a run's (resolved or recorded) ``config`` asks its figures in: its
    ``figure_formats`` key, PNG alone for a run recorded before the key existed."""
    return tuple((config or {}).get("figure_formats") or DEFAULT_FORMATS)


def figure_paths(path: Path, formats: Sequence[str] = DEFAULT_FORMATS) -> list[Path]:
    """The files of the figure ``path`` (with or without an image suffix), one per format."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix.lstrip(".").lower() in FORMATS else path
    return [stem.with_name(f"{stem.name}.{fmt}") for fmt in formats]


def figure_target(out: Path, name: str) -> Path:
    """Where a figure called ``name`` goes for ``--out``: ``out`` itself when it names an
    image (``.png``, ``.pdf``, ``.svg``), else ``out/<name>.png`` (a folder). An existing file
    of another kind (a dataset, say) is refused, never overwritten."""
    out = Path(out)
    if out.suffix.lstrip(".").lower() in FORMATS:
        return out
    if out.exists() and not out.is_dir():
        raise FedkitError(
            f"--out {out} is an existing file, not a folder or a .png/.pdf/.svg path; "
            "refusing to overwrite it"
        )
    return out / f"{name}.png"


def save_figure(fig: Any, path: Path, formats: Sequence[str] = DEFAULT_FORMATS) -> Path:
    """Write ``fig`` in each of ``formats`` beside each other and close it; returns the path
    of the first."""
    paths = figure_paths(path, formats)
    for target, fmt in zip(paths, formats):
        write_atomic(
            target,
            lambda fh, fmt=fmt: fig.savefig(
                fh, format=fmt, dpi=150, bbox_inches="tight", metadata=_METADATA[fmt]
            ),
        )
    _pyplot().close(fig)
    return paths[0]


def _rounds_axis(ax: Any, rounds: Sequence[int] = ()) -> None:
    """Whole rounds on the x axis, and with ``rounds`` (those run) only ticks within them:
    no round 0 nor a round past the last."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    locator = MaxNLocator(integer=True)
    if rounds:
        first, last = min(rounds), max(rounds)
        ticks = [t for t in locator.tick_values(first, last) if first <= t <= last]
        locator = FixedLocator(ticks or [first])
    ax.xaxis.set_major_locator(locator)
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)


def _simulated_time_axis(ax: Any, results: Mapping[str, Any]) -> None:
    """A run with a virtual clock (sites, an aggregation mode other than sync): a second x
    axis, on top, in simulated hours, from the rounds' ``simulated_seconds``."""
    timed = [
        (r["round"], r["simulated_seconds"] / 3600)
        for r in results["rounds"]
        if r.get("simulated_seconds") is not None
    ]
    if len(timed) < 2:
        return
    rounds, hours = (np.array(v, dtype=float) for v in zip(*timed))
    if np.any(np.diff(hours) <= 0):  # the mapping must be invertible
        return
    top = ax.secondary_xaxis(
        "top",
        functions=(lambda x: np.interp(x, rounds, hours), lambda h: np.interp(h, hours, rounds)),
    )
    top.set_xlabel("simulated time (h)", fontsize=8)
    top.tick_params(labelsize=7)


def _legend_below(fig: Any, axes: Sequence[Any]) -> None:
    """One legend for the figure, below the axes, from the labelled lines of all axes."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    fig.legend(
        seen.values(),
        seen.keys(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(4, len(seen)),
        frameon=False,
        fontsize=8,
    )


def _fairness_text(scopes: Mapping[str, Any], where: str) -> str:
    """The fairness of ``scopes`` (a round's or the final scores), saying ``where`` from."""
    fair = scopes.get("fairness") or {}
    if not fair:
        return ""
    worst = f" ({fair['worst_client']})" if fair.get("worst_client") else ""
    return f"{where} across clients: std {fair['std']:.3f}, worst {fair['worst']:.3f}{worst}"


def curve_split(runs: Sequence[Mapping[str, Any]]) -> str:
    """The split per-round curves show: ``test`` where every evaluated round of every run was
    tested (``eval_test=every``), else ``validation``, which every evaluated round has (with
    ``eval_test=improved`` test curves would hold only the best and the last round)."""
    evaluated = [r for x in runs for r in x["rounds"] if "val" in r]
    return "test" if all(has_test(r) for r in evaluated) else "validation"


def _curve_points(results: Mapping[str, Any], split: str) -> dict[int, Mapping[str, Any]]:
    """Round -> that round's scopes (global, clients, clients_mean, fairness) of ``split``."""
    if split == "test":
        return {r["round"]: r for r in results["rounds"] if has_test(r)}
    return {r["round"]: r["val"] for r in results["rounds"] if "val" in r}


def _round_numbers(results: Mapping[str, Any]) -> list[int]:
    return [r["round"] for r in results["rounds"]]


def plot_run(
    results: Mapping[str, Any], directory: Path, formats: Sequence[str] | None = None
) -> list[Path]:
    """``curves`` and ``clients`` (:func:`draw_curves`, :func:`draw_clients`) in
    ``directory``, in ``formats`` (default: the run's ``figure_formats``); nothing for a run
    without a tested round."""
    if not any(has_test(r) for r in results["rounds"]):
        return []
    formats = formats or figure_formats(results.get("config"))
    directory = Path(directory)
    return [
        save_figure(draw_curves(results), directory / "curves.png", formats),
        save_figure(draw_clients(results), directory / "clients.png", formats),
    ]


def draw_curves(results: Mapping[str, Any]) -> Any:
    """Main metric per round for the global model, each client and their mean (the split
    in the panel's title: test when every round was tested, else validation, with the
    final test scores marked so the figure meets the results table) and the mean local
    training loss."""
    plt = _pyplot()
    main = results["task"]["main_metric"]
    name = metric_name(main)
    split = curve_split([results])
    points = _curve_points(results, split)
    rounds, evaluated = list(points), list(points.values())
    final = results["final"]
    view = client_view(final)
    suffix = "" if view == "global" else f" ({view} model)"
    fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    clients = list(results["task"]["client_ids"])
    for cid in clients:
        ys = [r["clients"].get(cid, {}).get(main, np.nan) for r in evaluated]
        ax.plot(rounds, ys, lw=1, alpha=0.6, label=f"client {cid}{suffix}")
    means = [r["clients_mean"].get(main, np.nan) for r in evaluated]
    ax.plot(rounds, means, "k--", lw=1.5, label="mean over clients")
    glob = [r["global"].get(main, np.nan) for r in evaluated]
    ax.plot(rounds, glob, "k-", lw=2.5, label=f"global model, pooled {split}")
    last = f"round {rounds[-1]} ({split})" if rounds else split
    if split != "test":  # the table's numbers are the final round's test scores
        for scope, marker, label, shift in (  # side by side: close values stay apart
            ("global", "D", "global model", 0.1),
            ("clients_mean", "s", "mean over clients", 0.2),
        ):
            value = final.get(scope, {}).get(main)
            if value is not None:
                ax.plot(
                    [final["round"] + shift],
                    [value],
                    marker=marker,
                    ls="none",
                    color="tab:red",
                    mfc="none",
                    mew=1.5,
                    label=f"final test, {label} {value:.3f}",
                )
    timed = any(r.get("simulated_seconds") is not None for r in results["rounds"])
    fig.suptitle(curves_title(results), y=1.2 if timed else 1.12)  # above a time axis
    ax.set(
        ylabel=f"{split} {name}",
        title=f"{split} {metric_name(main, short=True)} per round\n"
        f"{_fairness_text(points[rounds[-1]], last) if rounds else ''}",
    )
    run_rounds = _round_numbers(results)
    _rounds_axis(ax, run_rounds)
    _simulated_time_axis(ax, results)
    # a private run's clients keep their losses (the records hold none)
    reported = [
        r for r in results["rounds"] if any("loss" in c for c in r.get("train", {}).values())
    ]
    loss_rounds = [r["round"] for r in reported]
    losses = [np.mean([c["loss"] for c in r["train"].values() if "loss" in c]) for r in reported]
    ax_loss.plot(loss_rounds, losses, "o-", ms=3, color="tab:gray")
    ax_loss.set(ylabel="mean local training loss", title="training loss per round")
    _rounds_axis(ax_loss, run_rounds)
    _legend_below(fig, [ax])
    return fig


def num_classes(task: Mapping[str, Any]) -> int | None:
    """A recorded task's number of classes (its ``class_names``); ``None`` if not recorded."""
    names = task.get("class_names")
    return len(names) if names else None


def draw_clients(results: Mapping[str, Any]) -> Any:
    """Bars from zero of the final test main metric per client, each value written on its
    bar, with the global model's value, the clients' mean and the chance level
    (:func:`~fedkit_core.results.labels.chance_level`) as lines and the fairness in the
    title."""
    plt = _pyplot()
    main = results["task"]["main_metric"]
    clients = list(results["task"]["client_ids"])
    final = results["final"]
    view = client_view(final)
    values = np.array([final["clients"].get(c, {}).get(main, np.nan) for c in clients], float)
    fig, ax = plt.subplots(figsize=(max(4.5, 0.6 * len(clients) + 2.5), 3.6))
    ax.bar(range(len(clients)), values, color="tab:blue", alpha=0.8)
    for i, v in enumerate(values):
        if np.isfinite(v):
            ax.annotate(f"{v:.3f}", (i, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(clients)), clients, rotation=45 if len(clients) > 6 else 0, ha="right")
    shown = list(values)
    if main in final.get("global", {}):
        shown.append(final["global"][main])
        ax.axhline(shown[-1], color="k", lw=1.5, label=f"global model {shown[-1]:.3f}")
    mean = final.get("clients_mean", {}).get(main)
    if mean is not None:
        ax.axhline(mean, color="k", ls="--", lw=1, label=f"mean over clients {mean:.3f}")
    classes = num_classes(results["task"])
    chance = chance_level(main, classes)
    if chance is not None:
        shown.append(chance)
        why = "AUC" if chance == 0.5 and "auc" in main else f"1/{classes} classes"
        ax.axhline(chance, color="tab:red", ls=":", lw=1.5, label=f"chance {chance:.3f} ({why})")
    top = max((v for v in shown if np.isfinite(v)), default=1.0)
    ax.set_ylim(0.0, 1.15 * max(top, 1e-3))  # bars start at zero; room for the values
    served = "global model" if view == "global" else f"personalised ({view} view)"
    ax.set(
        ylabel=f"test {metric_name(main)}",
        title=f"final round (test) per client, {served}\n{_fairness_text(final, 'test')}",
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


def _title(results: Mapping[str, Any]) -> str:
    """A run's name in figures and reports (:func:`run_label`)."""
    return run_label(results["config"], results["task"]["name"])


def curves_title(results: Mapping[str, Any]) -> str:
    """The title of a run's ``curves``: its name, and below it the model, the aggregation
    mode, the sites and the DP level (with the epsilon spent), defaults said too."""
    parts = setting_parts(results["config"], always=True)
    privacy = (results.get("final") or {}).get("privacy")
    if privacy and privacy.get("epsilon") is not None:
        parts[-1] += f", ε = {privacy['epsilon']:.3g} at δ = {privacy['delta']:g}"
    name = run_label(results["config"], results["task"]["name"], setting=False)
    return f"{name}\n{', '.join(parts)}"


_PANELS = (  # (round record scope, key, panel title)
    ("global", None, "global model, pooled clients"),
    ("clients_mean", None, "mean over the clients"),
    ("fairness", "std", "std across clients (lower is fairer)"),
)
#: line styles, markers and band hatches of the methods in a comparison, in turn: two
#: methods with the same curves stay told apart (one dashed with squares over one solid with
#: circles), and overlapping bands show two hatches rather than one blended colour
_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_HATCHES = ("///", "\\\\\\", "|||", "---", "xxx", "...")


def _per_round(
    runs: Sequence[Mapping[str, Any]], scope: str, key: str | None, split: str = "test"
) -> tuple:
    """Rounds with ``split`` scores in every run and the ``(runs, rounds)`` values of one
    scope."""
    main = runs[0]["task"]["main_metric"]
    evaluated = [_curve_points(x, split) for x in runs]
    rounds = sorted(set.intersection(*(set(e) for e in evaluated)))
    values = [[(e[k].get(scope) or {}).get(key or main, np.nan) for k in rounds] for e in evaluated]
    return rounds, np.array(values, dtype=float)


def identical_groups(
    curves: Mapping[str, Sequence[tuple[Sequence[int], np.ndarray]]],
) -> list[list[str]]:
    """The sets (two or more labels, in order) of groups whose curves (``{label: [(rounds,
    values) per panel]}``) are equal within float tolerance: drawn on top of each other,
    one would hide the other."""
    found: list[list[str]] = []
    for label, panels in curves.items():
        for members in found:
            if _same_curves(curves[members[0]], panels):
                members.append(label)
                break
        else:
            found.append([label])
    return [members for members in found if len(members) > 1]


def _same_curves(a: Sequence[tuple], b: Sequence[tuple]) -> bool:
    return all(
        list(ra) == list(rb)
        and va.shape == vb.shape
        and np.allclose(va, vb, rtol=1e-9, atol=1e-12, equal_nan=True)
        for (ra, va), (rb, vb) in zip(a, b)
    )


def _final_values(runs: Sequence[Mapping[str, Any]], scope: str, key: str | None) -> np.ndarray:
    """Each run's final (test) value of one scope, as the compare table reads it."""
    main = runs[0]["task"]["main_metric"]
    return np.array(
        [(x["final"].get(scope) or {}).get(key or main, np.nan) for x in runs], dtype=float
    )


def _clip(
    low: np.ndarray, high: np.ndarray, bounds: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray]:
    """A band ``[low, high]`` within the range ``bounds`` of its metric (as it is)."""
    if bounds is None:
        return low, high
    return np.clip(low, *bounds), np.clip(high, *bounds)


def plot_groups(
    groups: Mapping[str, Sequence[Mapping[str, Any]]],
    path: Path,
    references: Mapping[str, str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> Path:
    """:func:`draw_groups` saved to ``path`` in ``formats``."""
    return save_figure(draw_groups(groups, references), path, formats)


def draw_groups(
    groups: Mapping[str, Sequence[Mapping[str, Any]]],
    references: Mapping[str, str] | None = None,
) -> Any:
    """Main metric per round of each group of runs (a runspec's seeds): the mean line and,
    with two or more runs, a light hatched mean ± std band; panels for the global model,
    the clients' mean and the std across clients (fairness). Curves are on the test split
    when every round was tested, else on validation with each group's final test value
    (mean ± std, the compare table's number) marked at the last round. Each method has its
    own colour, line style, marker and hatch; groups with identical curves are named
    together (``fedavg = fedprox``) in the legend and the title. ``references``
    (``{group: label}``: the pooled and local references, not methods) are drawn dashed,
    without markers, under their label."""
    references = references or {}
    plt = _pyplot()
    from matplotlib.colors import to_rgba

    first = next(iter(groups.values()))[0]
    name = metric_name(first["task"]["main_metric"])
    short = metric_name(first["task"]["main_metric"], short=True)
    split = curve_split([x for runs in groups.values() for x in runs])
    curves = {
        label: [_per_round(runs, scope, key, split) for scope, key, _ in _PANELS]
        for label, runs in groups.items()
    }
    shown = [
        k for k in range(len(_PANELS)) if any(np.isfinite(c[k][1]).any() for c in curves.values())
    ]
    main = first["task"]["main_metric"]
    bounds = [value_range(f"{scope}.{key or main}") for scope, key, _ in _PANELS]
    same = identical_groups(curves)
    twins = {label: [m for m in members if m != label] for members in same for label in members}
    fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.6), squeeze=False)
    axes[0][0].set_ylabel(f"{split} {name}")
    for ax, k in zip(axes[0], shown):
        scope, key, title = _PANELS[k]
        method = 0
        for i, (label, runs) in enumerate(groups.items()):
            color = f"C{i % 10}"
            rounds, values = curves[label][k]
            shown_label = references.get(label, label)
            if label in twins:
                shown_label += f" (= {', '.join(twins[label])})"
            if label in references:
                style = {"ls": "--", "lw": 1.8}
                hatch = None
            else:
                style = {
                    "ls": _STYLES[method % len(_STYLES)],
                    "marker": _MARKERS[method % len(_MARKERS)],
                    "ms": 4,
                    "mfc": "none",
                    "lw": 1.5,
                }
                hatch = _HATCHES[method % len(_HATCHES)]
                method += 1
            if not np.isfinite(values).any():  # e.g. solo has no global model
                ax.plot([], [], color=color, label=shown_label, **style)  # in the legend
                continue
            with warnings.catch_warnings():  # a round no run of the group scored
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmean(values, axis=0)
                std = np.nanstd(values, axis=0)
            ax.plot(rounds, mean, color=color, label=shown_label, **style)
            if len(runs) < MIN_SEEDS_INTERVAL:  # each seed's own curve: two make no band
                for seed_values in values if len(runs) > 1 else ():
                    ax.plot(rounds, seed_values, color=color, lw=0.8, alpha=0.5, ls=style["ls"])
            else:  # a faint fill, clipped to the metric's range; hatched in its colour
                low, high = _clip(mean - std, mean + std, bounds[k])
                ax.fill_between(
                    rounds,
                    low,
                    high,
                    facecolor=to_rgba(color, 0.08),
                    edgecolor=to_rgba(color, 0.5),  # the hatch's colour; lw 0: no outline
                    hatch=hatch,
                    lw=0,
                )
            if split != "test":
                _mark_final(ax, runs, scope, key, color, i, len(groups), bounds[k])
        ax.set_title(title)
        _rounds_axis(ax, [r for runs in groups.values() for x in runs for r in _round_numbers(x)])
    sizes = sorted({len(runs) for runs in groups.values()})
    lines = [f"{split} {short} per round"]
    if sizes != [1]:
        lines[0] += f", mean ± std over {'/'.join(map(str, sizes))} seeds"
    if 1 < sizes[0] < MIN_SEEDS_INTERVAL:
        lines[0] += f" (under {MIN_SEEDS_INTERVAL} seeds: each seed drawn, no band)"
    if split != "test":
        lines.append(
            "◇ final round on test, as in the compare table "
            "(test curves per round: --set eval_test=every)"
        )
    if same:
        lines.append("identical curves: " + "; ".join(" = ".join(m) for m in same))
    fig.suptitle("\n".join(lines), y=1.0 + 0.06 * (len(lines) - 1))
    _legend_below(fig, axes[0])
    return fig


def _mark_final(
    ax: Any,
    runs: Sequence[Mapping[str, Any]],
    scope: str,
    key: str | None,
    color: str,
    index: int,
    count: int,
    bounds: tuple[float, float] | None = None,
) -> None:
    """A group's final test value of one scope at its last round: mean and, with
    :data:`MIN_SEEDS_INTERVAL` or more runs, a ± std bar clipped to ``bounds`` (with two,
    each seed's value as a dot); groups side by side, a little apart, so none hides
    another."""
    values = _final_values(runs, scope, key)
    if not np.isfinite(values).any():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, std = float(np.nanmean(values)), float(np.nanstd(values))
    x = max(x["final"]["round"] for x in runs) + 0.25 + 0.08 * (index - (count - 1) / 2)
    error = None
    if len(runs) >= MIN_SEEDS_INTERVAL:
        low, high = _clip(np.array([mean - std]), np.array([mean + std]), bounds)
        error = [[mean - low[0]], [high[0] - mean]]
    elif len(runs) > 1:
        ax.plot([x] * len(values), values, ls="none", marker=".", ms=4, color=color)
    ax.errorbar(
        [x],
        [mean],
        yerr=error,
        marker="D",
        ms=5,
        mfc="none",
        mew=1.5,
        color=color,
        capsize=2,
        ls="none",
    )


def plot_client_gains(
    section: Mapping[str, Any],
    path: Path,
    labels: Mapping[str, str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> Path:
    """Each client's paired gain over the reference runspec (the ``clients`` section of a
    comparison, :func:`fedkit_core.results.clients.clients_section`): one bar per runspec
    and client, the mean gain over seeds with its 95% paired-t interval clipped to the
    metric's range (from :data:`MIN_SEEDS_INTERVAL` seeds on; with two, each seed's
    difference as a dot); references (named in ``labels``) hatched; the axis within the
    differences the metric allows."""
    plt = _pyplot()
    labels = labels or {}
    gains = section["gains"]
    clients = list(dict.fromkeys(c for per in section["scores"].values() for c in per))
    specs = list(gains)
    seeds = len(section["seeds"])
    order = list(section["scores"])  # every runspec: the colours of the compare figure
    width = 0.8 / max(len(specs), 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(clients) * len(specs) + 2.5), 3.8))
    for i, spec in enumerate(specs):
        xs = np.arange(len(clients)) + (i - (len(specs) - 1) / 2) * width
        found = [gains[spec].get(c) for c in clients]
        means = np.array([np.nan if g is None else g["mean"] for g in found])
        errors = None
        if seeds >= MIN_SEEDS_INTERVAL and all(g is None or "ci_t" in g for g in found):
            low = [0.0 if g is None else g["mean"] - g["ci_t"][0] for g in found]  # clipped
            high = [0.0 if g is None else g["ci_t"][1] - g["mean"] for g in found]
            errors = np.array([low, high])
        elif seeds > 1:  # too few seeds for an interval: each seed's difference as a dot
            for x, g in zip(xs, found):
                if g is not None:
                    ax.plot([x] * len(g["per_seed"]), g["per_seed"], "k.", ms=4)
        reference = spec in labels
        color = f"C{order.index(spec) % 10}"
        ax.bar(
            xs,
            means,
            width,
            yerr=errors,
            capsize=2,
            color=color,
            alpha=0.55 if reference else 0.85,
            hatch="//" if reference else None,
            edgecolor=color,
            label=labels.get(spec, spec),
        )
    ax.axhline(0.0, color="k", lw=1)
    ax.set_xticks(range(len(clients)), clients, rotation=45 if len(clients) > 6 else 0)
    metric = metric_name(section["metric"], short=True)
    reference = section["reference"]
    interval = (
        "95% paired-t intervals (clipped to the metric's range)"
        if seeds >= MIN_SEEDS_INTERVAL
        else "one seed: no interval"
        if seeds == 1
        else f"each seed's difference as a dot (under {MIN_SEEDS_INTERVAL} seeds: no interval)"
    )
    bounds = value_range(section["metric"])
    if bounds is not None:  # a difference of scores in [lo, hi] lies in [lo - hi, hi - lo]
        span = bounds[1] - bounds[0]
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, -span * 1.05), min(high, span * 1.05))
    ax.set(
        ylabel=f"gain in test {metric} over {reference}",
        title=f"each client's gain over {labels.get(reference, reference)}\n"
        f"mean over {seeds} paired seed{'s' * (seeds != 1)}, {interval}",
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return save_figure(fig, path, formats)


def plot_runs(
    runs: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    path: Path,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> Path:
    """Several runs in one figure, one line each (see :func:`draw_groups`)."""
    groups = {label: [results] for results, label in zip(runs, labels)}
    return plot_groups(groups, path, formats=formats)


def plot_partition(
    task: Any, infos: Mapping[str, Any], path: Path, formats: Sequence[str] = DEFAULT_FORMATS
) -> Path:
    """Heatmap of training samples (pixels for segmentation) per client and class, from the
    clients' own statistics (``{client id: ClientInfo}``, as a simulation holds them)."""
    plt = _pyplot()
    clients = list(infos)
    counts = np.array([infos[c].class_counts for c in clients], dtype=float)
    fig, ax = plt.subplots(
        figsize=(max(5, 0.7 * task.num_classes + 2), max(3, 0.45 * len(clients) + 1.5))
    )
    shown = counts / counts.sum(axis=1, keepdims=True) if task.kind == "segmentation" else counts
    image = ax.imshow(shown, cmap="viridis", aspect="auto")
    for i in range(len(clients)):
        for j in range(task.num_classes):
            text = f"{shown[i, j]:.2f}" if task.kind == "segmentation" else f"{int(counts[i, j])}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7,
                color="white" if shown[i, j] < shown.max() / 2 else "black",
            )
    ax.set_xticks(range(task.num_classes), task.class_names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(clients)), clients, fontsize=8)
    unit = "pixel share" if task.kind == "segmentation" else "training samples"
    ax.set(title=f"{task.name}: {unit} per client and class")
    fig.colorbar(image, ax=ax)
    return save_figure(fig, path, formats)
