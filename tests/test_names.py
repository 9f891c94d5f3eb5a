"""Names a user can find: run folders and report labels name the model, aggregation mode,
DP level and seed; names in any script stay readable and short enough for the file system;
a run that fails before its first round leaves no folder behind."""

from __future__ import annotations

import re

import pytest

from fedkit_core import api
from fedkit_core.cli import main
from fedkit_core.fileio import MAX_NAME_BYTES, folder_name
from fedkit_core.results.labels import run_label
from fedkit_core.results.report import report, run_labels
from fedkit_core.results.schema import Results
from fedkit_core.results.store import default_out
from fedkit_core.tasks.folder import write_fake
from fedkit_core.testing import tiny

DEFAULTS = {"name": None, "plugins": [], "task.name": "npz", "model": "cnn", "dp.level": "none"}


def test_names_in_any_script_keep_their_letters():
    assert folder_name("病院A") == "病院A"
    assert folder_name("Klinik Ärzte/Süd") == "Klinik_Ärzte_Süd"
    assert folder_name("अस्पताल") == "अस्पताल"  # combining vowel signs are letters' marks
    assert folder_name("..") == "__" and folder_name("a/../b") == "a_.._b"


def test_long_names_are_cut_with_a_digest_that_keeps_them_apart():
    one, two = folder_name("é" * 120), folder_name("é" * 119 + "e")
    assert len(one.encode()) <= MAX_NAME_BYTES and len(two.encode()) <= MAX_NAME_BYTES
    assert one != two and one.startswith("é" * 40) and one[-9] == "-"
    assert folder_name("病" * 200).encode().decode() == folder_name("病" * 200)  # whole chars


def test_default_run_folders_name_model_aggregation_sites_and_dp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = default_out(DEFAULTS).name
    assert plain.startswith("fedavg-npz-cnn-2")
    lite = {**DEFAULTS, "model": "efficientnet_lite0", "aggregation": "fedbuff"}
    lite.update({"dp.level": "client", "sites": "examples/sites/rural.yaml"})
    assert default_out(lite).name.startswith(
        "fedavg-npz-efficientnet_lite0-fedbuff-rural-dp-client-"
    )
    named = default_out({**DEFAULTS, "name": "病院A"}).name
    assert named.startswith("病院A-2")
    long = default_out({**DEFAULTS, "name": "é" * 200}).name
    assert re.fullmatch(r"é+-[0-9a-f]{8}-\d{8}-\d{6}", long)  # the time stays whole
    assert len(long.encode()) <= MAX_NAME_BYTES + 16


def test_report_labels_name_the_setting_and_seed():
    label = run_label({**DEFAULTS, "aggregation": "fedasync", "dp.level": "sample"}, "npz")
    assert label == "fedavg on npz (cnn, fedasync, dp-sample)"


def test_a_run_that_fails_before_its_first_round_leaves_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-such-data"
    code = main(["run", "--task", "folder", "--set", f"task.path={missing}", "-q"])
    assert code == 2 and "no-such-data" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_two_seeds_are_two_rows_in_a_report(tmp_path):
    dirs = [tmp_path / "a" / "run", tmp_path / "b" / "run"]
    for seed, out in enumerate(dirs):
        api.run(tiny(rounds=1, seed=seed), out=out)
    rows, _, _ = report(dirs)
    assert rows[0]["run"] != rows[1]["run"]
    assert rows[0]["run"] == "fedavg on synthetic (cnn) seed 0"
    twins = [Results.load(dirs[0])] * 2  # alike in all but the folder: the folder said
    assert run_labels(["x/one", "y/two"], twins)[1].endswith("seed 0 [two]")


@pytest.mark.slow
def test_a_long_non_latin_site_name_runs_through_checkpoints(tmp_path):
    long = "é" * 120  # 240 bytes: a valid folder name, too long once percent-encoded
    root = write_fake(tmp_path / "data", sites=(long, "病院A", "b"), per_class=3)
    config = {"task": {"name": "folder", "path": str(root), "image_size": 16, "cache": "off"}}
    results = api.run({**config, "rounds": 2, "batch_size": 8}, out=tmp_path / "run")
    assert results["status"] == "complete" and long in results["final"]["clients"]
    folders = [p.name for p in (tmp_path / "run" / "checkpoint" / "clients").iterdir()]
    assert len(folders) == 3 and all(len(f.encode()) <= MAX_NAME_BYTES for f in folders)
    resumed = api.resume(tmp_path / "run", rounds=3)
    assert resumed["status"] == "complete" and len(resumed["rounds"]) == 3
