"""The fedkit command end to end: outputs, exit codes for user errors, resume after SIGKILL."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedkit_core.cli import main
from fedkit_core.testing import tiny

FEDKIT = [sys.executable, "-m", "fedkit_core.cli"]


@pytest.fixture
def tiny_yaml(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny(checkpoint=True)))
    return path


@pytest.mark.slow
def test_run_writes_results_metrics_and_plots(tmp_path, tiny_yaml, capsys):
    out = tmp_path / "run"
    assert main(["run", "--config", str(tiny_yaml), "--rounds", "2", "--out", str(out), "-q"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete"
    assert {"config", "plugins", "task", "rounds", "final"} <= set(results)
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    final = results["final"]
    assert {"global", "clients", "fairness", "best", "wall_seconds"} <= set(final)
    assert {"std", "worst"} <= set(final["fairness"])
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["round", "split", "scope"] and "bacc" in header
    assert (out / "curves.png").stat().st_size > 1000 and (out / "clients.png").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["rounds"] == 2
    assert main(["run", "--config", str(tiny_yaml), "--out", str(out)]) == 2  # refuses to overwrite
    assert "fedkit resume" in capsys.readouterr().err


def corrupt_npz(tmp_path):
    path = tmp_path / "corrupt.npz"
    path.write_bytes(b"PK\x03\x04 broken")
    return str(path)


def latin1_yaml(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: r\xe9sum\xe9\n".encode("latin-1"))
    return str(path)


def a_file(tmp_path):
    path = tmp_path / "taken"
    path.write_text("")
    return str(path)


def bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rounds: [\n")
    return str(path)


USER_ERRORS = {
    "unknown plugin": (["run", "--plugin", "fedprox2"], "unknown plugin"),
    "unknown task": (["run", "--task", "mnist"], "unknown task"),
    "unknown key": (["run", "--set", "learning_rate=0.1"], "unknown config key"),
    "bad value": (["run", "--set", "rounds=ten"], "expects int"),
    "bad choice": (["run", "--set", "optimizer=lbfgs"], "must be one of"),
    "bad yaml": (lambda tmp: ["run", "--config", bad_yaml(tmp)], "not valid YAML"),
    "missing data": (
        ["run", "--task", "npz", "--set", "task.path=/nonexistent/x.npz"],
        "does not exist",
    ),
    "corrupt data": (
        lambda tmp: ["run", "--task", "npz", "--set", f"task.path={corrupt_npz(tmp)}"],
        "cannot read",
    ),
    "not a run dir": (lambda tmp: ["resume", str(tmp)], "not a fedkit run directory"),
    "bad seeds": (["compare", "fedavg", "--seeds", "a,b"], "--seeds"),
    "no seeds": (["compare", "fedavg", "--seeds", ""], "--seeds is empty"),
    "zero jobs": (["compare", "fedavg", "--jobs", "0"], "--jobs must be a whole number"),
    "jobs with logger": (["compare", "fedavg", "-j", "2", "--logger", "csv"], "without --jobs"),
    "negative alpha": (
        ["run", "--set", "partition.kind=dirichlet", "--set", "partition.alpha=-1"],
        "partition.alpha must be above 0",
    ),
    "negative seed": (["run", "--seed", "-1"], "seed must be 0 or more"),
    "zero image size": (["run", "--set", "task.image_size=0"], "task.image_size must be"),
    "val fraction": (["run", "--set", "task.val_fraction=1.5"], "task.val_fraction must be"),
    "unet for classes": (["run", "--set", "model=unet"], "model=unet is for segmentation"),
    "inactive plugin key": (["run", "--set", "fedprox.mu=1"], "add --plugin fedprox"),
    "non-utf8 yaml": (lambda tmp: ["run", "--config", latin1_yaml(tmp)], "not UTF-8"),
    "out is a file": (lambda tmp: ["run", "--out", a_file(tmp)], "is a file"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(USER_ERRORS))
def test_user_errors_exit_2_with_one_short_message(case, tmp_path, capsys):
    args, message = USER_ERRORS[case]
    args = args(tmp_path) if callable(args) else args
    own_out = args[0] != "run" or "--out" in args
    assert main(args if own_out else [*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.splitlines()) <= 8


@pytest.mark.slow
def test_nan_loss_names_client_and_round(tmp_path, tiny_yaml, capsys):
    args = [
        "run",
        "--config",
        str(tiny_yaml),
        "--set",
        "optimizer=sgd",
        "--set",
        "lr=1e30",
        "--out",
        str(tmp_path / "nan"),
        "-q",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "client 'site0'" in err and "round 1" in err and "nan" in err.lower()


@pytest.mark.slow
def test_debug_shows_the_traceback(tiny_yaml, tmp_path):
    proc = subprocess.run(
        [*FEDKIT, "run", "--task", "nope", "--debug"], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def _run_until_checkpoint(config: Path, out: Path, rounds: int) -> subprocess.Popen:
    """A `fedkit run` in a subprocess, returned once ``rounds`` rounds are checkpointed."""
    proc = subprocess.Popen(
        [*FEDKIT, "run", "--config", str(config), "--out", str(out), "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # a shell's background job (CI scripts, `nohup ... &`) ignores SIGINT, and an ignored
        # signal is inherited: give the run Python's usual Ctrl-C handling back
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    manifest = out / "checkpoint" / "latest.json"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if manifest.is_file() and json.loads(manifest.read_text())["round"] >= rounds:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    return proc


@pytest.mark.slow
def test_ctrl_c_exits_130_and_says_how_to_resume(tmp_path):
    config = tmp_path / "c.yaml"
    # many rounds: the run is interrupted after the first, so it must not be able to finish
    config.write_text(yaml.safe_dump(tiny(rounds=500, checkpoint=True)))
    proc = _run_until_checkpoint(config, tmp_path / "run", 1)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert f"fedkit resume {tmp_path / 'run'}" in err and "Traceback" not in err


def _numbers(tree, path=""):
    """Every number in a JSON tree, by its path."""
    if isinstance(tree, dict):
        return {k: v for key in tree for k, v in _numbers(tree[key], f"{path}/{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, x in enumerate(tree) for k, v in _numbers(x, f"{path}/{i}").items()}
    return {path: tree} if isinstance(tree, (int, float)) and not isinstance(tree, bool) else {}


FLOWER = {"engine": "flower", "flower": {"backend": "thread"}}


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param({}, marks=pytest.mark.slow, id="local"),  # three commands: ~15 s
        pytest.param(
            FLOWER,
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(
                    importlib.util.find_spec("flwr") is None, reason="needs fedkit[flower]"
                ),
            ],
            id="flower",
        ),
    ],
)
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, engine):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=12, checkpoint=True, **engine)))
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    proc = _run_until_checkpoint(config, killed, 3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = json.loads((killed / "results.json").read_text())
    assert done["status"] == "running" and len(done["rounds"]) < 12
    subprocess.run([*FEDKIT, "resume", str(killed), "-q"], check=True, capture_output=True)
    subprocess.run(
        [*FEDKIT, "run", "--config", str(config), "--out", str(straight), "-q"],
        check=True,
        capture_output=True,
    )
    a = json.loads((killed / "results.json").read_text())
    b = json.loads((straight / "results.json").read_text())
    assert a["status"] == "complete" and len(a["rounds"]) == 12
    assert a["config"]["engine"] == (engine.get("engine") or "local")
    final_a, final_b = _numbers(a["final"]), _numbers(b["final"])
    del final_a["/wall_seconds"], final_b["/wall_seconds"]
    assert final_a.keys() == final_b.keys() and len(final_a) > 20
    assert max(abs(final_a[k] - final_b[k]) for k in final_a) == 0
    for key in ("global", "clients", "clients_mean", "fairness", "best"):
        assert a["final"][key] == b["final"][key]
    assert not [p for p in (killed / "checkpoint").rglob(".*")], "no temp files left"


@pytest.mark.slow
def test_compare_two_runspecs_writes_table(tmp_path, tiny_yaml, capsys):
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "fedavg",
                str(tiny_yaml),
                "--config",
                str(tiny_yaml),
                "--seeds",
                "0,1",
                "--rounds",
                "1",
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    table = json.loads((out / "compare.json").read_text())
    assert set(table) == {"fedavg", str(tiny_yaml), "diff", "clients", "references", "convergence"}
    assert table["convergence"]["fedavg"]["converged"] is None  # one round: nothing to judge
    assert set(table["diff"]) == {str(tiny_yaml)}  # paired differences to the first runspec
    assert table["references"] == {} and table["clients"]["reference"] == "fedavg"
    entry = table["fedavg"]["final.global.bacc"]
    assert len(entry["per_seed"]) == 2 and entry["mean"] == pytest.approx(
        np.mean(entry["per_seed"])
    )
    for key in (
        "final.clients_mean.bacc",
        "final.fairness.std",
        "final.fairness.worst",
        "best.global.bacc",
    ):
        assert key in table["fedavg"]
    assert "| fedavg |" in (out / "compare.md").read_text()
    assert (out / "compare.png").is_file()


@pytest.mark.slow
def test_plugins_tasks_data_and_report_commands(tmp_path, tiny_yaml, capsys):
    assert main(["plugins"]) == 0
    assert "fedavg" in capsys.readouterr().out
    assert main(["tasks"]) == 0
    assert "synthetic-seg" in capsys.readouterr().out
    assert main(["data", "--config", str(tiny_yaml), "--out", str(tmp_path / "p.png")]) == 0
    assert "site0" in capsys.readouterr().out and (tmp_path / "p.png").is_file()
    run_dir = tmp_path / "r"
    assert main(["run", "--config", str(tiny_yaml), "--out", str(run_dir), "-q"]) == 0
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0  # one run: per-client table and summary
    out = capsys.readouterr().out
    assert "site0" in out and "fairness (bacc)" in out and "status complete" in out
    assert main(["report", str(run_dir), str(run_dir), "--out", str(tmp_path / "rep.png")]) == 0
    assert (tmp_path / "rep.png").is_file()
    out = capsys.readouterr().out
    parts = out.count("final round; clients")  # tables that fit the console side by side
    assert parts >= 1 and out.count("fedavg") == 2 * parts  # a row per run in each


def test_a_wide_comparison_is_printed_in_tables_that_fit_the_console():
    from rich.console import Console

    from fedkit_core.cli.display import print_rows

    specs = [f"method{i}" for i in range(13)]
    rows = [{"metric": m, **{s: f"0.{i}123 ± 0.0456" for i, s in enumerate(specs)}} for m in "ab"]
    console = Console(width=80, record=True, force_terminal=False)
    print_rows(console, rows, "mean ± std")
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text  # nothing cut off
    for s in specs:
        assert s in text
    parts = text.count("metric")
    assert parts > 1 and f"(1/{parts})" in text  # the first column repeated in every part


def test_data_on_a_narrow_console_keeps_every_column(tmp_path, tiny_yaml, capsys, monkeypatch):
    """Rich drops columns that do not fit (a piped `fedkit data` lost the client ids and a
    class of Fed-ISIC2019's table): the class counts are split into tables that fit."""
    from fedkit_core.cli.options import console

    monkeypatch.setattr(console, "width", 30)
    assert main(["data", "--config", str(tiny_yaml), "--out", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    for column in ("client", "train", "val", "test", "site0"):
        assert column in out
    assert "…" not in out and "(2/" in out


@pytest.mark.slow
def test_compare_says_how_many_finished_runs_it_reused(tmp_path, tiny_yaml, capsys):
    argv = ["compare", "fedavg", "--config", str(tiny_yaml), "--seeds", "0,1", "--rounds", "1"]
    argv += ["--out", str(tmp_path / "cmp"), "-q"]
    assert main(argv) == 0
    assert "reused" not in capsys.readouterr().out  # all were run
    assert main(argv) == 0
    assert "reused 2 of 2 runs, found finished in" in capsys.readouterr().out


@pytest.mark.slow
def test_off_a_terminal_a_run_prints_plain_lines(tmp_path, tiny_yaml, capsys):
    out = tmp_path / "run"
    assert main(["run", "--config", str(tiny_yaml), "--rounds", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out  # captured: not a terminal
    assert "round 1/2" in printed and "round 2/2" in printed
    assert printed.index("before round 1: a few timed training steps") < printed.index("round 1/2")
    assert "━" not in printed and "\x1b[" not in printed


def test_tables_off_a_terminal_wrap_long_words_rather_than_cut_them(capsys):
    assert main(["tasks"]) == 0
    printed = capsys.readouterr().out
    assert "…" not in printed and "*.png|jpg" in printed
