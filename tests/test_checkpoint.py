"""Checkpoints are data, never code: pickled objects and manifests pointing out of the run
folder are refused as corrupt; each client keeps its newest two rounds and resumes from the
newest one the server committed."""

import json
import os
import shutil

import pytest
import torch
import yaml

from fedkit_core import FedkitError, resume, run
from fedkit_core.engines.checkpoint import ClientCheckpoints, ServerCheckpoints
from fedkit_core.engines.snapshot import from_bytes, to_bytes
from fedkit_core.testing import tiny

PLANTED = []  # what the payload below would append to, were it ever run


class Payload:
    """A pickle that runs code when loaded (``__reduce__``), as a planted checkpoint would."""

    def __reduce__(self):
        return (PLANTED.append, ("the payload ran",))


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run with 3 rounds done of 4, marked as interrupted."""
    out = tmp_path_factory.mktemp("ckpt") / "run"
    run(tiny(rounds=3, checkpoint=True), out=out)
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["rounds"] = 4
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    results = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**results, "status": "running"}))
    return out


def test_a_snapshot_round_trips_tensors_and_plain_values():
    snapshot = {"w": torch.arange(3.0), "n": 2, "nested": {"l": [1.5, None, "x", (1, 2)]}}
    back = from_bytes(to_bytes(snapshot))
    assert torch.equal(back["w"], snapshot["w"]) and back["nested"] == snapshot["nested"]


def test_a_pickled_object_is_refused_without_running_it(interrupted, tmp_path):
    with pytest.raises(FedkitError, match="corrupt or not a fedkit snapshot"):
        from_bytes(to_bytes({"state": Payload()}))
    planted = shutil.copytree(interrupted, tmp_path / "run")
    manifest = json.loads((planted / "checkpoint" / "latest.json").read_text())
    torch.save({"next_round": Payload()}, planted / "checkpoint" / manifest["server"])
    with pytest.raises(FedkitError, match="objects other than tensors and plain values"):
        resume(planted)
    assert PLANTED == []


def test_a_pickled_object_in_a_client_checkpoint_is_refused(tmp_path):
    out = tmp_path / "run"
    run(tiny(rounds=1, checkpoint=True), out=out)
    (planted,) = (out / "checkpoint" / "clients" / "site1").glob("r*.pt")
    torch.save({"client": Payload()}, planted)
    with pytest.raises(FedkitError, match="corrupt or not a fedkit snapshot"):
        ClientCheckpoints.of(out / "checkpoint", "site1").load(1)
    assert PLANTED == []


@pytest.mark.parametrize("name", ["../x.pt", "/etc/passwd", "sub/server-r1.pt", "..", 3])
def test_a_manifest_naming_a_file_outside_its_folder_is_corrupt(tmp_path, name):
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    torch.save({"next_round": 2}, tmp_path / "x.pt")
    (directory / "latest.json").write_text(json.dumps({"round": 1, "server": name}))
    with pytest.raises(FedkitError, match="manifest .* is corrupt"):
        ServerCheckpoints(directory).load()


def test_a_garbled_manifest_is_corrupt(tmp_path):
    (tmp_path / "latest.json").write_bytes(b"\xff{")
    with pytest.raises(FedkitError, match="manifest .* is corrupt"):
        ServerCheckpoints(tmp_path).load()


def test_a_client_keeps_its_newest_two_rounds_and_resumes_from_the_committed_one(tmp_path):
    store = ClientCheckpoints.of(tmp_path, "site/../0")
    assert store.folder.parent == tmp_path / "clients" and store.load(5) is None
    for rnd in (1, 3, 4):
        store.save({"round": rnd, "w": torch.tensor(float(rnd))})
    (store.folder / ".r5.pt.abc.tmp").write_bytes(b"half")  # a writer killed mid-file
    store.save({"round": 5, "w": torch.tensor(5.0)})
    assert sorted(os.listdir(store.folder)) == ["r4.pt", "r5.pt"]
    assert store.load(4)["round"] == 4 and store.load(9)["round"] == 5
    assert store.load(3) is None


def test_resume_continues_a_run_to_its_uninterrupted_results(interrupted):
    resumed = resume(interrupted)
    straight = run(tiny(rounds=4))
    assert len(resumed.rounds) == 4
    for scope in ("global", "clients", "fairness"):
        assert resumed.final[scope] == straight.final[scope]
