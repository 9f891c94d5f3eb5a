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
