"""Reliability (issue 18): a run never overwrites what is not its own, a failed run does not
block its rerun, an edited config is not silently resumed, concurrent default run folders
never collide, and temporary files of killed writers are removed."""

import json
import threading

import pytest
import yaml

from fedkit_core import FedkitError, resume, run
from fedkit_core.results.store import RunDir, config_hash, default_out
from fedkit_core.testing import tiny


def test_run_out_refuses_a_folder_that_is_not_a_run(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.json").write_text('{"my": "results"}')
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(FedkitError, match="not a fedkit run and holds notes.txt, results.json"):
        run(tiny(rounds=1), out=mine)
    assert (mine / "results.json").read_text() == '{"my": "results"}'
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "results.json"]
    with pytest.raises(FedkitError, match="is not a fedkit results file"):  # nor reported
        RunDir(mine).load_results()


def test_an_empty_folder_is_a_fine_run_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run(tiny(rounds=1), out=tmp_path / "empty").final


def test_a_run_failing_before_its_first_round_does_not_block_its_rerun(tmp_path):
    out = tmp_path / "r"
    bad = {"rounds": 1, "task": {"name": "npz", "path": str(tmp_path / "absent.npz")}}
    with pytest.raises(FedkitError, match="does not exist"):  # found once the run started
        run(bad, out=out)
    assert not RunDir(out).is_run()  # no config.yaml left to claim the folder
    assert run(tiny(rounds=1), out=out).final


@pytest.fixture
def unfinished(tmp_path):
    """A checkpointed run of 1 round, marked as interrupted after it."""
    out = tmp_path / "run"
    run(tiny(rounds=1, checkpoint=True), out=out)
    results = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**results, "status": "running"}))
    return out


def _edit(out, **values):
    config = yaml.safe_load((out / "config.yaml").read_text())
    config.update(values)
    (out / "config.yaml").write_text(yaml.safe_dump(config))


def test_resume_refuses_an_edited_config_naming_the_change(unfinished):
    _edit(unfinished, lr=0.5, plugins=["fedprox"])
    with pytest.raises(FedkitError, match=r"edited after the run started \(lr: 0.001 -> 0.5; "):
        resume(unfinished)
    with pytest.raises(FedkitError, match=r"plugins: \[\] -> \['fedprox'\]"):
        resume(unfinished)


@pytest.mark.slow
def test_resume_accepts_an_edit_when_told_and_records_it(unfinished):
    _edit(unfinished, lr=0.5)
    assert resume(unfinished, accept_edits=True)["config"]["lr"] == 0.5
    assert "lr: 0.001 -> 0.5" in (unfinished / "config-edits.log").read_text()


@pytest.mark.slow
def test_more_rounds_extend_a_run_without_a_flag(unfinished):
    _edit(unfinished, rounds=2)
    assert len(resume(unfinished).rounds) == 2
    assert "rounds: 1 -> 2" in (unfinished / "config-edits.log").read_text()


STEPPED = {"checkpoint": True, "lr_schedule": "step", "lr_milestones": [2, 3], "lr_gamma": 0.1}


@pytest.mark.slow
def test_a_complete_run_extended_trains_as_a_run_planned_that_long(tmp_path):
    planned = run(tiny(rounds=3, **STEPPED), out=tmp_path / "planned")
    run(tiny(rounds=1, **STEPPED), out=tmp_path / "short")
    with pytest.raises(FedkitError, match="extend it with `fedkit resume .* --rounds 3`"):
        run(tiny(rounds=3, **STEPPED), out=tmp_path / "short", reuse=True)
    extended = resume(tmp_path / "short", rounds=3)
    assert extended["status"] == "complete" and extended.final["round"] == 3
    assert extended.final["global"] == planned.final["global"]
    assert extended.final["clients"] == planned.final["clients"]
    assert run(tiny(rounds=3, **STEPPED), out=tmp_path / "short", reuse=True).final["round"] == 3


@pytest.mark.slow
def test_a_run_older_than_an_option_is_extended_twice(tmp_path):
    """The checkpoint of a resumed run records options fedkit gained since the run began,
    at their defaults; its config.yaml lacks them: that is no edit."""
    out = tmp_path / "r"
    run(tiny(rounds=1, checkpoint=True), out=out)
    config = yaml.safe_load((out / "config.yaml").read_text())
    del config["dp"]["grad_sample"]  # as made before the option existed
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    (out / "config.sha256").write_text(config_hash(config) + "\n")
    assert resume(out, rounds=2).final["round"] == 2
    assert resume(out, rounds=3).final["round"] == 3
    with pytest.raises(FedkitError, match=r"started \(lr: 0.001 -> 0.5; rounds: 3 -> 4\)"):
        _edit(out, lr=0.5)
        resume(out, rounds=4)
    assert yaml.safe_load((out / "config.yaml").read_text())["rounds"] == 3  # left as it was


def test_an_edit_to_more_rounds_is_never_answered_with_the_old_results(tmp_path):
    run(tiny(rounds=1, checkpoint=True), out=tmp_path / "r")
    _edit(tmp_path / "r", rounds=2)
    assert resume(tmp_path / "r").final["round"] == 2


def test_an_extension_needs_a_checkpoint_more_rounds_and_no_private_budget(tmp_path):
    run(tiny(rounds=1, checkpoint=True), out=tmp_path / "r")
    with pytest.raises(FedkitError, match="has run 1 rounds; --rounds must be more"):
        resume(tmp_path / "r", rounds=1)
    run(tiny(rounds=1), out=tmp_path / "unsaved")
    with pytest.raises(FedkitError, match="has no checkpoint .* cannot be extended"):
        resume(tmp_path / "unsaved", rounds=2)
    assert yaml.safe_load((tmp_path / "unsaved" / "config.yaml").read_text())["rounds"] == 1
    _edit(tmp_path / "r", dp={"level": "client"})  # as if it had run under DP
    with pytest.raises(FedkitError, match="calibrated for its 1 planned rounds"):
        resume(tmp_path / "r", rounds=2)


def test_default_run_folders_never_collide(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = {"name": "same", "plugins": [], "task.name": "synthetic"}
    made, start = [], threading.Barrier(8)

    def name():
        start.wait()
        made.append(default_out(config))

    threads = [threading.Thread(target=name) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)


@pytest.mark.slow
def test_a_killed_writers_temporary_files_are_removed(unfinished):
    orphans = [unfinished / ".results.json.x1.tmp", unfinished / "checkpoint" / ".s.pt.x2.tmp"]
    for orphan in orphans:
        orphan.write_bytes(b"half")
    (unfinished / "keep.tmp").write_text("the user's")
    resume(unfinished)
    assert not any(o.exists() for o in orphans) and (unfinished / "keep.tmp").is_file()


def test_an_edit_is_told_from_the_checkpoint_when_the_other_records_are_gone(unfinished):
    (unfinished / "config.sha256").unlink()
    (unfinished / "results.json").unlink()
    _edit(unfinished, lr=0.5)
    with pytest.raises(FedkitError, match=r"edited after the run started \(lr: 0.001 -> 0.5\)"):
        resume(unfinished)


@pytest.mark.slow
def test_resume_without_any_record_of_the_config_needs_accept_edits(unfinished):
    (unfinished / "config.sha256").unlink()
    manifest = json.loads((unfinished / "checkpoint" / "latest.json").read_text())
    manifest.pop("config", None)  # a checkpoint of an older fedkit
    (unfinished / "checkpoint" / "latest.json").write_text(json.dumps(manifest))
    (unfinished / "results.json").unlink()
    _edit(unfinished, lr=0.5)
    with pytest.raises(FedkitError, match="record of the config .* is missing or unreadable"):
        resume(unfinished)
    assert resume(unfinished, accept_edits=True)["config"]["lr"] == 0.5
    log = (unfinished / "config-edits.log").read_text()
    assert "without a record of the config it started with" in log and "- -> " not in log


@pytest.mark.slow
def test_an_accepted_edit_logs_the_real_values_and_the_round_it_took_effect(unfinished):
    (unfinished / "results.json").unlink()  # the values before come from the checkpoint
    _edit(unfinished, lr=0.5, rounds=2)
    results = resume(unfinished, accept_edits=True)
    log = (unfinished / "config-edits.log").read_text()
    assert "lr: 0.001 -> 0.5; rounds: 1 -> 2" in log and "- -> " not in log
    (edit,) = results["config_edits"]
    assert edit["from_round"] == 2 and edit["changes"] == ["lr: 0.001 -> 0.5", "rounds: 1 -> 2"]
    assert json.loads((unfinished / "results.json").read_text())["config_edits"] == [edit]
    assert "config_edits" not in run(tiny(rounds=1))  # only runs with an accepted edit


@pytest.mark.slow
def test_compare_out_removes_only_what_it_wrote_and_refuses_the_users_files(tmp_path):
    from fedkit_core.comparison import compare
    from fedkit_core.results import compare as cmp

    out = tmp_path / "cmp"
    out.mkdir()
    mine = {"compare.py": "print('mine')", "compare.txt": "notes", "notes.md": "keep"}
    for name, text in mine.items():
        (out / name).write_text(text)
    layer = [tiny(rounds=1)]
    with pytest.raises(FedkitError, match="holds compare.py, compare.txt, notes.md, which fedkit"):
        compare(["fedavg"], seeds=[0], out=out, base=layer)
    assert {p.name: p.read_text() for p in out.iterdir()} == mine  # nothing removed

    fresh = tmp_path / "fresh"
    compare(["fedavg"], seeds=[0], out=fresh, base=layer)
    written = json.loads((fresh / cmp.MANIFEST).read_text())["files"]
    assert {"compare.json", "compare.md", "compare.tex", "compare.png"} <= set(written)
    (fresh / "compare.png").unlink()  # a stale output the next comparison does not miss
    compare(["fedavg"], seeds=[0], out=fresh, base=layer)  # its own files are replaced
    assert (fresh / "compare.png").is_file()
    (fresh / "compare.md").write_text("my edits")
    with pytest.raises(FedkitError, match="compare.md changed since fedkit wrote them"):
        compare(["fedavg"], seeds=[0], out=fresh, base=layer)
    assert (fresh / "compare.md").read_text() == "my edits"
