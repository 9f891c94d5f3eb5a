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
from fedkit_core.results.store import RunDir
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


@pytest.mark.slow
def test_a_pickled_object_is_refused_without_running_it(interrupted, tmp_path):
    with pytest.raises(FedkitError, match="corrupt or not a fedkit snapshot"):
        from_bytes(to_bytes({"state": Payload()}))
    planted = shutil.copytree(interrupted, tmp_path / "run")
    manifest = json.loads((planted / "checkpoint" / "latest.json").read_text())
    torch.save({"next_round": Payload()}, planted / "checkpoint" / manifest["server"])
    from fedkit_core.engines.checkpoint import file_digest

    manifest["sha256"] = file_digest(planted / "checkpoint" / manifest["server"])  # a planter's
    (planted / "checkpoint" / "latest.json").write_text(json.dumps(manifest))
    with pytest.raises(FedkitError, match="objects other than tensors and plain values"):
        resume(planted)
    assert PLANTED == []


@pytest.mark.slow
def test_a_pickled_object_in_a_client_checkpoint_is_refused(tmp_path):
    out = tmp_path / "run"
    run(tiny(rounds=1, checkpoint=True), out=out)
    (planted,) = (out / "checkpoint" / "clients" / "site1").glob("r*.pt")
    torch.save({"client": Payload()}, planted)
    from fedkit_core.engines.checkpoint import file_digest

    digests = json.loads((planted.parent / "digests.json").read_text())
    digests[planted.name] = file_digest(planted)  # as a planter would
    (planted.parent / "digests.json").write_text(json.dumps(digests))
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
    assert sorted(os.listdir(store.folder)) == ["digests.json", "r4.pt", "r5.pt"]
    assert store.load(4)["round"] == 4 and store.load(9)["round"] == 5
    assert store.load(3) is None


@pytest.mark.slow
def test_resume_continues_a_run_to_its_uninterrupted_results(interrupted):
    resumed = resume(interrupted)
    straight = run(tiny(rounds=4))
    assert len(resumed.rounds) == 4
    for scope in ("global", "clients", "fairness"):
        assert resumed.final[scope] == straight.final[scope]


def flip_a_bit(path):
    """Flip one bit of the first tensor's data in the checkpoint ``path`` (a torch zip
    file): the file still loads, with one number changed, as after a storage error."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename)
    with open(path, "r+b") as fh:
        fh.seek(info.header_offset + 26)
        name_length, extra_length = (int.from_bytes(fh.read(2), "little") for _ in range(2))
        where = info.header_offset + 30 + name_length + extra_length + 2  # a float's 3rd byte
        fh.seek(where)
        byte = fh.read(1)[0]
        fh.seek(where)
        fh.write(bytes([byte ^ 0x10]))


@pytest.fixture(scope="module")
def two_of_three(tmp_path_factory):
    """A run of 3 rounds interrupted after round 2 (its own: ``interrupted`` is resumed)."""
    out = tmp_path_factory.mktemp("ckpt2") / "run"
    run(tiny(rounds=2, checkpoint=True), out=out)
    config = yaml.safe_load((out / "config.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump({**config, "rounds": 3}))
    results = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**results, "status": "running"}))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("which", ["server", "client"])
def test_a_damaged_checkpoint_file_is_refused_naming_it_and_the_round(
    two_of_three, tmp_path, which
):
    damaged = shutil.copytree(two_of_three, tmp_path / "run")
    if which == "server":
        target = damaged / "checkpoint" / "server-r2.pt"
    else:
        target = damaged / "checkpoint" / "clients" / "site1" / "r2.pt"
    flip_a_bit(target)
    assert torch.load(target, weights_only=True)  # still a readable checkpoint
    with pytest.raises(FedkitError, match=rf"checkpoint file {target} \(round 2\) is damaged"):
        resume(damaged)
    message = str(pytest.raises(FedkitError, resume, damaged).value)
    assert f"restart it from round 1 by deleting {damaged / 'checkpoint'}" in message
    shutil.rmtree(damaged / "checkpoint")  # what the message says: the run starts again
    assert resume(damaged).final["global"] == run(tiny(rounds=3)).final["global"]


@pytest.mark.slow
def test_compare_checks_the_checkpoints_of_a_run_it_continues(two_of_three, tmp_path):
    from fedkit_core.comparison import compare

    out = tmp_path / "cmp"
    config = yaml.safe_load((two_of_three / "config.yaml").read_text())
    shutil.copytree(two_of_three, out / "fedavg" / "seed0")
    RunDir(out / "fedavg" / "seed0").save_config(config)  # a run of 3 rounds, cut after 2
    flip_a_bit(out / "fedavg" / "seed0" / "checkpoint" / "server-r2.pt")
    layer = {k: v for k, v in config.items() if k not in ("seed", "plugins")}
    with pytest.raises(FedkitError, match=r"server-r2.pt \(round 2\) is damaged"):
        compare(["fedavg"], seeds=[config["seed"]], out=out, base=[layer])


def damaged_copy(two_of_three, tmp_path):
    return shutil.copytree(two_of_three, tmp_path / "run")


@pytest.mark.slow
def test_a_missing_client_checkpoint_or_folder_is_refused_naming_it_and_the_round(
    two_of_three, tmp_path
):
    """Before: resumed silently from round 1's state, or the client from scratch."""
    damaged = damaged_copy(two_of_three, tmp_path)
    gone = damaged / "checkpoint" / "clients" / "site1" / "r2.pt"
    gone.unlink()  # still listed in digests.json
    with pytest.raises(FedkitError, match=rf"checkpoint file {gone} \(round 2\) is gone"):
        resume(damaged)
    shutil.rmtree(gone.parent)
    with pytest.raises(FedkitError, match=rf"folder {gone.parent} is gone .*restart it from"):
        resume(damaged)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["server", "client"])
def test_missing_digests_are_refused_unless_accepted_and_then_recorded(
    two_of_three, tmp_path, which
):
    damaged = damaged_copy(two_of_three, tmp_path)
    checkpoints = damaged / "checkpoint"
    if which == "server":
        manifest = json.loads((checkpoints / "latest.json").read_text())
        del manifest["sha256"]
        (checkpoints / "latest.json").write_text(json.dumps(manifest))
        flip_a_bit(checkpoints / "server-r2.pt")  # before: only a warning, and resumed
    else:
        (checkpoints / "clients" / "site1" / "digests.json").unlink()
    with pytest.raises(FedkitError, match="no recorded digest.*--accept-unverified"):
        resume(damaged)
    if which == "server":
        return  # accepting resumes a damaged file: nothing to compare it with
    resumed = resume(damaged, accept_unverified=True)
    (note,) = resumed["unverified_resumes"]
    assert note["round"] == 2 and "site1 (no digests.json)" in note["unverified"][0]
    assert json.loads((damaged / "results.json").read_text())["unverified_resumes"] == [note]
    assert not (checkpoints / "accepted-unverified.json").exists()


@pytest.mark.slow
def test_a_client_folder_copied_over_another_clients_is_refused(two_of_three, tmp_path):
    """Its digests match: before, the other client's state was resumed silently (with Ditto,
    other per-client scores)."""
    damaged = damaged_copy(two_of_three, tmp_path)
    clients = damaged / "checkpoint" / "clients"
    shutil.rmtree(clients / "site1")
    shutil.copytree(clients / "site2", clients / "site1")
    with pytest.raises(
        FedkitError, match=rf"{clients / 'site1'} holds the state of client 'site2'"
    ):
        resume(damaged)
