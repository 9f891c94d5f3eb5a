"""Paper-ready output: figures (whole rounds, legends outside, bars from zero against chance,
titles naming the split they plot, identical runs named, bands over seeds, PNG by default and
PDF/SVG on request in the run or compare folder) and the compare tables (readable headers,
booktabs LaTeX)."""

import re

import numpy as np
import pytest
import yaml
from matplotlib.collections import PolyCollection

from fedkit_core.cli import main
from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.results import compare, figure_process, markdown_table, plots
from fedkit_core.results.labels import chance_level
from fedkit_core.results.store import config_hash, write_json
from fedkit_core.testing import tiny

CLIENTS = ["site0", "site1", "site2"]


def fake_results(seed: int, personal: bool = False, rounds: int = 3) -> dict:
    """A results.json of ``rounds`` evaluated rounds with bACC between 0.4 and 0.8."""
    rng = np.random.default_rng(seed)

    def scopes(r):
        clients = {c: {"bacc": 0.4 + 0.06 * r + 0.05 * rng.random()} for c in CLIENTS}
        values = [m["bacc"] for m in clients.values()]
        return {
            "global": {"bacc": float(np.mean(values)) - 0.01},
            "clients": clients,
            "clients_mean": {"bacc": float(np.mean(values))},
            "fairness": {"std": float(np.std(values)), "worst": min(values)},
        }

    records = [
        {"round": r, "train": {c: {"loss": 2.0 / r} for c in CLIENTS}, "val": {}, **scopes(r)}
        for r in range(1, rounds + 1)
    ]
    final = {k: records[-1][k] for k in ("global", "clients", "clients_mean", "fairness")}
    shared = {c: {"bacc": 0.5} for c in CLIENTS}
    final["views"] = {"global": {"global": final["global"], "clients": shared}}
    if personal:
        final["views"]["personal"] = {"global": final["global"], "clients": final["clients"]}
    else:
        final["clients"] = shared
    final |= {"round": rounds, "best": {"global": final["global"]}, "wall_seconds": 1.0}
    return {
        "status": "complete",
        "config": {"name": None, "plugins": ["fca"] if personal else []},
        "task": {
            "name": "synthetic",
            "client_ids": CLIENTS,
            "main_metric": "bacc",
            "class_names": ["a", "b", "c", "d"],
        },
        "rounds": records,
        "final": final,
    }


@pytest.fixture
def figures(monkeypatch):
    """The figures saved during a test, drawn, by file name."""
    saved = {}
    original = plots.save_figure

    def keep(fig, path, formats=plots.DEFAULT_FORMATS):
        fig.canvas.draw()
        saved[path.name] = fig
        return original(fig, path, formats)

    monkeypatch.setattr(plots, "save_figure", keep)
    return saved


def round_ticks(ax):
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def outside(legend, ax):
    """Whether ``legend`` lies outside the data area of ``ax`` (display coordinates)."""
    box, area = legend.get_window_extent(), ax.get_window_extent()
    return not box.overlaps(area)


@pytest.mark.slow
def test_run_figures_are_paper_ready(tmp_path, figures):
    paths = plots.plot_run(fake_results(0, personal=True), tmp_path, plots.FORMATS)
    assert [p.name for p in paths] == ["curves.png", "clients.png"]
    for stem in ("curves", "clients"):
        for ext in ("png", "pdf", "svg"):
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 1000

    curves = figures["curves.png"]
    for ax in curves.axes:
        ticks = round_ticks(ax)
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    (legend,) = curves.legends
    assert all(outside(legend, ax) for ax in curves.axes)
    ax = curves.axes[0]
    assert ax.get_ylabel() == "test balanced accuracy"
    assert ax.get_title().startswith("test bACC per round\nround 3 (test) across clients: std")
    assert "worst" in ax.get_title()

    (bars,) = figures["clients.png"].axes
    assert bars.get_ylim()[0] == 0  # bars start at zero
    assert max(p.get_height() for p in bars.patches) < bars.get_ylim()[1]
    (chance,) = [line for line in bars.lines if line.get_label().startswith("chance")]
    assert list(chance.get_ydata()) == [0.25, 0.25]  # 1/4 classes
    assert "1/4 classes" in chance.get_label()
    assert "personalised" in bars.get_title() and "test" in bars.get_title()
    assert "std" in bars.get_title()
    assert outside(bars.get_legend(), bars)


@pytest.mark.slow
def test_a_run_writes_png_alone_unless_its_config_asks_for_more(tmp_path):
    plots.plot_run(fake_results(0), tmp_path / "default")
    assert {p.name for p in (tmp_path / "default").iterdir()} == {"curves.png", "clients.png"}
    asked = fake_results(0)
    asked["config"]["figure_formats"] = ["png", "pdf"]
    plots.plot_run(asked, tmp_path / "asked")
    assert {p.suffix for p in (tmp_path / "asked").iterdir()} == {".png", ".pdf"}


def test_figure_formats_is_checked_item_by_item_and_left_out_of_the_config_hash():
    cfg, _ = resolve_config([{"figure_formats": "png,svg"}])
    assert cfg["figure_formats"] == ["png", "svg"]
    assert resolve_config([{}])[0]["figure_formats"] == ["png"]
    with pytest.raises(FedkitError, match="figure_formats.*png, pdf, svg"):
        resolve_config([{"figure_formats": ["png", "gif"]}])
    assert config_hash(cfg.nested()) == config_hash(resolve_config([{}])[0].nested())


def test_chance_levels():
    assert chance_level("bacc", 4) == 0.25 and chance_level("acc", 2) == 0.5
    assert chance_level("tail_acc", 5) == 0.2
    assert chance_level("bauc", 10) == 0.5
    assert chance_level("dice", 2) is None and chance_level("bacc", None) is None


def test_clients_figure_of_dice_has_no_chance_line_and_an_axis_without_scores():
    results = fake_results(0)
    results["task"]["main_metric"] = "dice"  # no client holds a dice score
    (ax,) = plots.draw_clients(results).axes
    assert ax.get_ylim() == (0.0, 1.15)
    assert not [line for line in ax.lines if line.get_label().startswith("chance")]


def test_curves_of_a_run_tested_only_in_its_best_and_last_rounds_show_validation(tmp_path, figures):
    """eval_test=improved: rounds 1-3 validated, only round 4 tested; every round is drawn,
    the title's fairness is the last validated round's and the final test values are marked."""
    results = fake_results(0, rounds=4)
    for record in results["rounds"]:
        scopes = ("global", "clients", "clients_mean", "fairness")
        record["val"] = {k: {**record[k]} for k in scopes}
        record["val"]["fairness"] = {**record["fairness"], "std": 0.1 * record["round"]}
        if record["round"] < 4:
            record.update(evaluated=["val"], **{"global": {}, "clients": {}})
    plots.plot_run(results, tmp_path)
    (ax, _) = figures["curves.png"].axes
    assert ax.get_ylabel() == "validation balanced accuracy"
    assert ax.get_title().startswith("validation bACC per round\nround 4 (validation)")
    assert "std 0.400" in ax.get_title()  # the panel's own numbers, not the final test ones
    pooled = next(line for line in ax.lines if line.get_label().startswith("global model"))
    assert list(pooled.get_xdata()) == [1, 2, 3, 4]
    assert list(pooled.get_ydata()) == [r["val"]["global"]["bacc"] for r in results["rounds"]]
    final = next(line for line in ax.lines if line.get_label().startswith("final test, global"))
    assert list(final.get_ydata()) == [results["final"]["global"]["bacc"]]
    plots.plot_groups({"fedavg": [results]}, tmp_path / "compare.png")
    fig = figures["compare.png"]
    assert fig.axes[0].get_ylabel() == "validation balanced accuracy"
    title = fig.get_suptitle()
    assert title.startswith("validation bACC per round") and "final round on test" in title


def test_compare_figure_draws_a_band_per_runspec_with_three_seeds(tmp_path, figures):
    three = [fake_results(0), fake_results(1), fake_results(3)]
    groups = {"fedavg": three, "fca": [fake_results(2, True)]}
    plots.plot_groups(groups, tmp_path / "compare.png")
    fig = figures["compare.png"]
    assert [ax.get_title() for ax in fig.axes] == [
        "global model, pooled clients",
        "mean over the clients",
        "std across clients (lower is fairer)",
    ]
    assert fig.get_suptitle().startswith("test bACC per round, mean ± std over 1/3 seeds")
    for ax in fig.axes:
        (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]  # fedavg
        assert band.get_facecolor()[0][3] <= 0.1 and band.get_hatch()  # no blended brown
        assert [line.get_label() for line in ax.lines] == ["fedavg", "fca"]
        assert len({(line.get_linestyle(), line.get_marker()) for line in ax.lines}) == 2
        assert all(float(t).is_integer() for t in round_ticks(ax))
    assert all(outside(fig.legends[0], ax) for ax in fig.axes)
    assert {p.name for p in tmp_path.iterdir()} == {"compare.png"}


def test_compare_figure_names_runspecs_whose_curves_are_identical(tmp_path, figures):
    groups = {
        "fedavg": [fake_results(0), fake_results(1)],
        "fedprox": [fake_results(0), fake_results(1)],
        "fca": [fake_results(2, True), fake_results(3, True)],
    }
    plots.plot_groups(groups, tmp_path / "compare.png")
    fig = figures["compare.png"]
    assert "identical curves: fedavg = fedprox" in fig.get_suptitle()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["fedavg (= fedprox)", "fedprox (= fedavg)", "fca"]
    for ax in fig.axes:  # the hidden one drawn apart: its own line style and marker
        labelled = [line for line in ax.lines if not line.get_label().startswith("_")]
        styles = [(line.get_linestyle(), line.get_marker()) for line in labelled]
        assert len(set(styles)) == 3  # (each seed's own thin line, unlabelled, beside them)


def test_compare_tables_have_readable_headers_notes_and_the_same_numbers(tmp_path):
    runs = {
        "fedavg": [fake_results(0), fake_results(1)],
        "fca": [fake_results(2, True), fake_results(3, True)],
    }
    table = compare.aggregate(runs)
    compare.write_summary(tmp_path, table, runs, "bacc", [0, 1], formats=["png", "pdf"])
    md = (tmp_path / "compare.md").read_text()
    tex = (tmp_path / "compare.tex").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| runspec"))
    assert "| global bACC | clients mean bACC | fairness std | fairness worst |" in header
    assert "final." not in md and "final." not in tex
    assert "fedavg: global model, not personalised" in md
    assert "fca: personalised (personal view)" in md
    assert "bACC: balanced accuracy" in md
    for rule in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert tex.count(rule) == 1
    assert "personalised (personal view)" in tex
    number = re.compile(r"\d+\.\d{4}")
    md_rows = [line for line in md.splitlines() if line.startswith(("| fedavg", "| fca"))]
    tex_rows = [line for line in tex.splitlines() if line.startswith(("fedavg &", "fca &"))]
    assert [number.findall(r) for r in md_rows] == [number.findall(r) for r in tex_rows]
    assert number.findall(md_rows[0])[0] == f"{table['fedavg']['final.global.bacc']['mean']:.4f}"
    assert {p.name for p in tmp_path.glob("compare*.p*")} == {"compare.png", "compare.pdf"}


def test_markdown_table_keeps_its_signature_for_plugins():
    entry = {"mean": 0.5, "std": 0.25}
    text = markdown_table({"a_b": {"x": entry}}, ["x"], headers=["G bACC"], digits=2)
    assert text.splitlines()[0] == "| runspec | G bACC |"
    assert markdown_table({"a": {"x": entry}}, ["x"], 100.0, 1).endswith("50.0 ± 25.0 |\n")


@pytest.mark.slow
def test_report_overlay_goes_into_the_runs_folder(tmp_path, monkeypatch):
    for spec, seed in (("fedavg", 0), ("fca", 1)):
        write_json(tmp_path / "cmp" / spec / "seed0" / "results.json", fake_results(seed))
    monkeypatch.chdir(tmp_path)
    assert main(["report", "cmp/fedavg/seed0", "cmp/fca/seed0"]) == 0
    assert {p.name for p in (tmp_path / "cmp").glob("report.*")} == {"report.png"}
    assert not (tmp_path / "cmp" / "fca" / "seed0" / "curves.svg").exists()
    assert main(["report", "cmp/fedavg/seed0", "cmp/fca/seed0", "--figure-formats", "png,svg"]) == 0
    assert {p.name for p in (tmp_path / "cmp").glob("report.*")} == {"report.png", "report.svg"}
    assert (tmp_path / "cmp" / "fca" / "seed0" / "curves.svg").is_file()
    assert main(["report", "cmp/fca/seed0", "--figure-formats", "png,gif"]) == 2
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_report_overlay_never_overwrites_the_users_file_in_the_runs_folder(tmp_path, monkeypatch):
    for spec, seed in (("fedavg", 0), ("fca", 1)):
        write_json(tmp_path / "cmp" / spec / "seed0" / "results.json", fake_results(seed))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cmp" / "report.png").write_bytes(b"the user's figure")
    assert main(["report", "cmp/fedavg/seed0", "cmp/fca/seed0"]) == 2
    assert (tmp_path / "cmp" / "report.png").read_bytes() == b"the user's figure"
    assert main(["report", "cmp/fedavg/seed0", "cmp/fca/seed0", "--out", "figs"]) == 0
    (tmp_path / "cmp" / "report.png").unlink()
    assert main(["report", "cmp/fedavg/seed0", "cmp/fca/seed0"]) == 0
    assert main(["report", "cmp/fedavg/seed0", "cmp/fca/seed0"]) == 0  # its own: replaced


@pytest.mark.slow
def test_a_report_overlay_in_a_comparison_folder_is_fedkits_for_compare_out(tmp_path, monkeypatch):
    from fedkit_core.results.store import OwnedOutputs

    out = tmp_path / "cmp"
    for spec, seed in (("fedavg", 0), ("fca", 1)):
        write_json(out / spec / "seed0" / "results.json", fake_results(seed))
    OwnedOutputs(out, compare.MANIFEST).record(["fedavg", "fca"])
    monkeypatch.chdir(tmp_path)
    assert main(["report", "cmp/fedavg/seed0", "cmp/fca/seed0"]) == 0
    OwnedOutputs(out, compare.MANIFEST).claim(["fedavg", "fca"])  # before: "holds report.png"
    (out / "report.png").write_bytes(b"edited")
    with pytest.raises(FedkitError, match="report.png, which fedkit did not write"):
        OwnedOutputs(out, compare.MANIFEST).claim(["fedavg", "fca"])


@pytest.fixture
def tiny_yaml(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny()))
    return path


def test_data_writes_into_a_new_folder_and_never_over_a_dataset(tmp_path, tiny_yaml, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dataset = tmp_path / "x.npz"
    np.savez(dataset, images=np.zeros((2, 4, 4), np.uint8))
    before = dataset.read_bytes()
    assert main(["data", "--config", str(tiny_yaml), "-o", str(dataset)]) == 2
    assert dataset.read_bytes() == before

    assert main(["data", "--config", str(tiny_yaml)]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("data-synthetic-")
    assert {p.name for p in folder.iterdir()} == {"partition.png"}
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_run_writes_the_figure_formats_asked_for(tmp_path, tiny_yaml, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    args = ["run", "--config", str(tiny_yaml), "--figure-formats", "png,pdf", "-q", "-o", str(out)]
    assert main(args) == 0
    figures = {p.name for p in out.iterdir() if p.suffix in (".png", ".pdf", ".svg")}
    assert figures == {"curves.png", "curves.pdf", "clients.png", "clients.pdf"}
    assert main(["run", "--config", str(tiny_yaml), "--figure-formats", "jpg", "-q"]) == 2
    assert not (tmp_path / "runs").exists()  # refused before anything ran


# the figure process (fedkit run, fedkit resume): the same files as drawn in-process, written
# when plot_run returns, and a failing figure still an error of the command


def test_the_figure_process_draws_what_the_command_would_and_hands_back_errors(tmp_path):
    results = fake_results(0)
    plots.plot_run(results, tmp_path / "here")  # in this process, the reference
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with figure_process.drawing_in_background():
        assert figure_process._helper  # sent to the helper, not drawn here
        figure_process.plot_run(results, tmp_path / "there")
        with pytest.raises(OSError):  # cannot be written: the helper's error, raised here
            figure_process.plot_run(results, blocked)
    for name in ("curves.png", "clients.png"):
        assert (tmp_path / "there" / name).read_bytes() == (tmp_path / "here" / name).read_bytes()
    assert not figure_process._helper


def test_outside_the_block_figures_are_drawn_in_this_process(tmp_path):
    figure_process.plot_run(fake_results(1), tmp_path)
    assert (tmp_path / "curves.png").is_file()


def spread_results(seed: int, level: float) -> dict:
    """:func:`fake_results` whose scores all sit at ``level`` (seeds far apart: wide bands)."""
    results = fake_results(seed)
    for record in [*results["rounds"], results["final"]]:
        for scope in ("global", "clients_mean"):
            record[scope] = {"bacc": level}
    return results


@pytest.mark.slow
def test_with_two_seeds_the_compare_figure_draws_each_seed_not_a_band(tmp_path, figures):
    groups = {"fedavg": [spread_results(0, 0.05), spread_results(1, 0.95)]}
    plots.plot_groups(groups, tmp_path / "compare.png")
    fig = figures["compare.png"]
    assert "under 3 seeds: each seed drawn, no band" in fig.get_suptitle()
    ax = fig.axes[0]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]
    seeds = sorted({float(line.get_ydata()[0]) for line in ax.lines})
    assert seeds == pytest.approx([0.05, 0.5, 0.95])  # each seed and their mean


@pytest.mark.slow
def test_bands_of_three_seeds_stay_within_the_metrics_range(tmp_path, figures):
    levels = [0.02, 0.03, 0.98]  # mean ± std runs past 0 and 1 unclipped
    groups = {"fedavg": [spread_results(s, v) for s, v in enumerate(levels)]}
    plots.plot_groups(groups, tmp_path / "compare.png")
    ax = figures["compare.png"].axes[0]
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.min() >= 0.0 and ys.max() <= 1.0


def gain_section(per_seed: dict[str, list[float]]) -> dict:
    """A comparison's clients section: fedavg's gain over solo at each client, per seed."""
    from fedkit_core.results.clients import client_gain

    seeds = list(range(len(next(iter(per_seed.values())))))
    gains = {
        c: client_gain([0.5 + d for d in ds], [0.5] * len(ds), "bacc") for c, ds in per_seed.items()
    }
    scores = {spec: {c: {"mean": 0.5} for c in per_seed} for spec in ("solo", "fedavg")}
    return {
        "metric": "bacc",
        "reference": "solo",
        "seeds": seeds,
        "gains": {"fedavg": gains},
        "scores": scores,
    }


def test_a_t_interval_wider_than_the_metric_allows_is_clipped():
    from fedkit_core.metrics.paired import paired_difference

    wide = paired_difference([0.9, 0.1], [0.2, 0.3], bounds=(0.0, 1.0))  # t: +-6 around 0.25
    assert wide["ci_t"] == [-1.0, 1.0] and wide["clipped"]
    assert paired_difference([0.9, 0.1], [0.2, 0.3])["ci_t"][0] < -5  # unbounded: as it was
    narrow = paired_difference([0.6, 0.61, 0.62], [0.5, 0.5, 0.5], bounds=(0.0, 1.0))
    assert not narrow["clipped"] and narrow["significant"]
    seconds = "final.wall_seconds"
    table = {
        "a": {"final.global.bacc": {"per_seed": [0.2, 0.3]}, seconds: {"per_seed": [1, 2]}},
        "b": {"final.global.bacc": {"per_seed": [0.9, 0.1]}, seconds: {"per_seed": [9, 1]}},
    }
    diff = compare.paired_table(table)["b"]
    assert diff["final.global.bacc"]["ci_t"] == [-1.0, 1.0]  # a bACC difference is in [-1, 1]
    assert diff[seconds]["ci_t"][1] > 1  # a time is not bounded
    (row,) = [r for r in compare.diff_rows({"b": diff}, ["final.global.bacc"])]
    assert row["95% CI t"] == "[-1.0000, +1.0000]"


@pytest.mark.slow
def test_client_gains_of_two_seeds_show_the_seeds_and_an_axis_within_the_range(tmp_path, figures):
    section = gain_section({"site0": [0.4, -0.35], "site1": [0.1, 0.12]})
    assert section["gains"]["fedavg"]["site0"]["ci_t"][0] == -1.0  # clipped in the table too
    plots.plot_client_gains(section, tmp_path / "compare-clients.png")
    ax = figures["compare-clients.png"].axes[0]
    assert "each seed's difference as a dot" in ax.get_title()
    low, high = ax.get_ylim()
    assert low >= -1.05 and high <= 1.05
    dots = sorted(y for line in ax.lines if line.get_marker() == "." for y in line.get_ydata())
    assert dots == pytest.approx([-0.35, 0.1, 0.12, 0.4])
    assert ax.containers[0].errorbar is None  # no interval drawn from two seeds


def test_curves_title_names_the_setting_and_ticks_stay_within_the_rounds(tmp_path, figures):
    results = fake_results(0, rounds=2)
    results["config"] |= {"model": "cnn", "aggregation": "fedbuff", "sites": "x/rural.yaml"}
    results["config"]["dp.level"] = "client"
    results["final"]["privacy"] = {"epsilon": 3.21, "delta": 1e-5}
    for record, seconds in zip(results["rounds"], (1800.0, 5400.0)):
        record["simulated_seconds"] = seconds
    plots.plot_run(results, tmp_path)
    fig = figures["curves.png"]
    assert fig.get_suptitle() == (
        "fedavg on synthetic\n"
        "cnn, aggregation fedbuff, sites rural, client-level DP, ε = 3.21 at δ = 1e-05"
    )
    for ax in fig.axes[:2]:
        assert [float(t) for t in ax.xaxis.get_majorticklocs()] == [1.0, 2.0]
    (top,) = fig.axes[0].child_axes  # simulated time, offered on top
    assert top.get_xlabel() == "simulated time (h)"
    assert top.xaxis.get_major_formatter()  # drawn
    plain = fake_results(1, rounds=2)
    plots.plot_run(plain, tmp_path)
    assert figures["curves.png"].get_suptitle().endswith("\ncnn, aggregation sync, no DP")
    assert not figures["curves.png"].axes[0].child_axes  # no virtual clock: no time axis
