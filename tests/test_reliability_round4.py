"""Reliability, round four (issue 45): files fedkit did not write are never removed nor
overwritten (manifests naming files outside their folder, report overlays in a folder of the
user's), and what a run writes cannot be turned against the user."""

from __future__ import annotations

import hashlib
import json

import pytest

from fedkit_core.cli import main
from fedkit_core.errors import FedkitError
from fedkit_core.results.compare import MANIFEST
from fedkit_core.results.store import OwnedOutputs, write_json


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["../victim.txt", "ABSOLUTE", "sub/../../victim.txt", ".."])
def test_a_planted_manifest_naming_files_outside_its_folder_removes_nothing(tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    out = tmp_path / "cmp"
    out.mkdir()
    name = str(victim) if name == "ABSOLUTE" else name
    write_json(out / MANIFEST, {"files": {name: digest(victim)}, "folders": []})
    with pytest.raises(FedkitError, match="not a file of .*delete it"):
        OwnedOutputs(out, MANIFEST).claim([])
    assert victim.read_text() == "the user's"


def test_a_manifest_entry_that_is_a_symlink_out_of_the_folder_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.md").symlink_to(victim)
    write_json(out / MANIFEST, {"files": {"compare.md": digest(victim)}, "folders": []})
    with pytest.raises(FedkitError, match="compare.md changed since fedkit wrote them"):
        OwnedOutputs(out, MANIFEST).claim([])
    assert victim.read_text() == "the user's" and (out / "compare.md").is_symlink()


def test_a_manifest_removes_its_files_only_while_they_hold_what_fedkit_wrote(tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.md").write_text("fedkit's")
    OwnedOutputs(out, MANIFEST).record([])
    OwnedOutputs(out, MANIFEST).claim([])
    assert not (out / "compare.md").exists()  # its own file: replaced by the next run
    (out / "compare.md").write_text("fedkit's")
    OwnedOutputs(out, MANIFEST).record([])
    (out / "compare.md").write_text("edited")
    with pytest.raises(FedkitError, match="changed since fedkit wrote them"):
        OwnedOutputs(out, MANIFEST).claim([])
    assert (out / "compare.md").read_text() == "edited"


@pytest.mark.slow
def test_torchs_unexpected_pos_writing_a_client_checkpoint_is_a_full_disk(
    tmp_path, monkeypatch, capsys
):
    """torch's zip writer reports a short write as "unexpected pos" (a RuntimeError): before,
    "a bug" (exit 1); now the full disk it is, with the way to go on (exit 2)."""
    import torch
    import yaml

    from fedkit_core.testing import tiny

    real = torch.save
    out = tmp_path / "run"

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and "client" in obj and obj["round"] >= 2:  # a client's
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=2, checkpoint=True)))
    capsys.readouterr()
    assert main(["run", "-c", str(config), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device writing" in err and "bug" not in err
    assert f"free space and run `fedkit resume {out}`" in err


@pytest.mark.slow
def test_a_full_disk_without_checkpoints_says_run_again_and_marks_the_run_failed(
    tmp_path, monkeypatch, capsys
):
    """Before: the advice was `fedkit resume` (which refuses a run without checkpoints) and
    results.json stayed "running"."""
    import errno

    import yaml

    from fedkit_core.results import store
    from fedkit_core.testing import tiny

    real = store.ResultsWriter.write

    def write(self, run_dir, results):
        if run_dir.results.exists():  # round 2 on: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir.results))
        return real(self, run_dir, results)

    monkeypatch.setattr(store.ResultsWriter, "write", write)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=3, checkpoint=False)))
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", "-c", str(config), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "cannot be resumed: free space and run it again" in err and "fedkit resume" not in err
    assert json.loads((out / "results.json").read_text())["status"] == "failed"


def test_a_read_only_run_folder_is_named_with_what_to_do(tmp_path, monkeypatch):
    """Before: the OSError named only the lock's temporary file (.run.lock.XXXX.tmp)."""
    import errno
    import tempfile

    from fedkit_core.results.store import RunDir

    def read_only(*args, dir=None, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", f"{dir}/.run.lock.abc.tmp")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    folder = tmp_path / "run"
    refused = rf"run folder {folder} cannot be written \(Read-only"
    with pytest.raises(FedkitError, match=refused), RunDir(folder).lock():
        pass
    message = str(pytest.raises(FedkitError, RunDir(folder).lock().__enter__).value)
    assert f"cp -r {folder} NEW" in message and ".tmp" not in message
