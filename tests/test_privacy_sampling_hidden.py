"""Under client-level DP with secret client sampling (``sample_fraction < 1``) nothing a run
writes says which clients a round sampled: the accountant's epsilon assumes amplification by
sampling, which a record naming the sampled clients would undo for its reader."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedkit_core import run
from fedkit_core.errors import FedkitError
from fedkit_core.privacy.layer import ServerPrivacy
from fedkit_core.tasks import synthetic
from fedkit_core.testing import tiny

CLIENTS = [f"site{i}" for i in range(6)]


def _documents(run_dir: Path) -> dict[str, Any]:
    """Every file of the run as data: JSON, YAML, CSV rows, checkpoints (``torch.load``),
    other text as its lines; plus the list of paths (a file per client and round is a
    record too)."""
    out: dict[str, Any] = {
        "<paths>": sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    }
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        name = str(path.relative_to(run_dir))
        if path.suffix == ".pt":
            out[name] = torch.load(path, weights_only=False)
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # figures
            continue
        if path.suffix == ".json":
            out[name] = json.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            out[name] = yaml.safe_load(text)
        elif path.suffix == ".csv":
            out[name] = list(csv.reader(io.StringIO(text)))
        else:
            out[name] = text.splitlines()
    return out


# Keys whose client sets come from evaluating the released global model on every site,
# whoever trained: ``one_class_sites`` names the sites where it predicted one class. Under DP
# noise that set is random and can equal a round's sample by chance (CI at deb8271).
EVALUATED = frozenset({"one_class_sites"})


def _nodes(item: Any):
    """Every dict and list inside ``item``, except those under an :data:`EVALUATED` key."""
    stack = [item]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(v for k, v in node.items() if k not in EVALUATED)
        elif isinstance(node, (list, tuple)):
            yield node
            stack.extend(node)


def _ids_in_paths(paths: list[str], rnd: int) -> set[str]:
    return {c for c in CLIENTS for p in paths if f"/{c}/" in f"/{p}" and f"r{rnd}." in p}


def _leaks(documents: dict[str, Any], sampled: dict[int, set[str]]) -> list[str]:
    """Where the files record a round's sampled clients: a container (a dict's keys, a
    list's strings, the client files of a round) naming exactly them, or a dict keyed by
    every client whose integer entries (bytes...) set them apart from the others."""
    found = []
    subsets = {frozenset(s) for s in sampled.values() if 0 < len(s) < len(CLIENTS)}
    for rnd, chosen in sampled.items():
        if 0 < len(chosen) < len(CLIENTS) and _ids_in_paths(documents["<paths>"], rnd) == chosen:
            found.append(f"client files of round {rnd}")
    for name, document in documents.items():
        for node in _nodes(document):
            keys = node.keys() if isinstance(node, dict) else node
            ids = frozenset(k for k in keys if isinstance(k, str) and k in CLIENTS)
            if ids in subsets:
                found.append(f"{name}: {sorted(ids)}")
            if isinstance(node, dict) and ids == frozenset(CLIENTS):
                for field in {k for v in node.values() if isinstance(v, dict) for k in v}:
                    values = {c: node[c].get(field) for c in CLIENTS}
                    if not all(type(v) is int for v in values.values()):  # no bools
                        continue
                    split = frozenset(c for c in CLIENTS if values[c] != values[CLIENTS[0]])
                    if split in subsets or frozenset(CLIENTS) - split in subsets:
                        found.append(f"{name}: per-client {field!r}")
    return found


def test_the_search_finds_a_planted_record_of_the_sample_and_skips_evaluated_sites():
    """The search can fail: a record naming a round's sample, or splitting the clients by
    an integer field, is found; a one-class-site entry naming the same clients is not."""
    sampled = {1: {"site0", "site3"}, 2: {"site1", "site2", "site5"}}
    paths = ["results.json", "checkpoint/clients/site0/r1.pt", "checkpoint/clients/site3/r1.pt"]
    planted = {
        "rounds": [{"round": 2, "train": {c: {"loss": 0.1} for c in sampled[2]}}],
        "bytes": {c: {"up": 10 if c in sampled[1] else 0} for c in CLIENTS},
    }
    found = _leaks({"<paths>": paths, "results.json": planted}, sampled)
    assert found == [
        "client files of round 1",
        "results.json: per-client 'up'",
        "results.json: ['site1', 'site2', 'site5']",
    ]
    evaluated = {"rounds": [{"round": 1, "one_class_sites": dict.fromkeys(sampled[1], 0)}]}
    assert _leaks({"<paths>": [], "results.json": evaluated}, sampled) == []


@pytest.mark.slow
def test_no_file_of_a_dp_run_records_which_clients_were_sampled(tmp_path, monkeypatch):
    sampled: dict[int, set[str]] = {}
    draw = ServerPrivacy.sample

    def spy(self, ids, rnd):
        chosen = draw(self, ids, rnd)
        sampled[rnd] = set(chosen)
        return chosen

    monkeypatch.setattr(ServerPrivacy, "sample", spy)
    config = tiny(
        rounds=3,
        checkpoint=True,
        sample_fraction=0.5,
        task={"sites": len(CLIENTS)},
        dp={"level": "client", "noise_multiplier": 1.0},
    )
    results = run(config, out=tmp_path / "run")
    assert sorted(sampled) == [1, 2, 3]
    # the search has something to find: a round that sampled some clients but not all
    assert any(0 < len(s) < len(CLIENTS) for s in sampled.values()), sampled
    assert _leaks(_documents(tmp_path / "run"), sampled) == []
    # what the records keep: the counts, one traffic total, the epsilon of every round
    for record in results.rounds:
        assert record["sampled_count"] == len(sampled[record["round"]])
        assert "sampled" not in record and "train" not in record
        assert list(record["bytes"]) == ["(all clients)"] and "epsilon" in record["privacy"]
    assert results.final["bytes"]["up"] > 0


def _client_streams(run_dir: Path) -> dict[str, torch.Tensor]:
    return {
        path.parent.name: torch.load(path, weights_only=False)["rng"]
        for path in sorted((run_dir / "checkpoint" / "clients").glob("*/r1.pt"))
    }


@pytest.mark.slow
def test_dp_sgd_batches_leave_no_trace_in_the_clients_stored_stream(tmp_path, monkeypatch):
    """DP-SGD's Poisson batches are secret; augmenting them from the client's own (stored)
    random stream would count the non-empty ones in its checkpoint. Two runs of one seed,
    batches of one expected sample (about a third of them empty), store the same streams."""
    load = synthetic.load

    def flip(x, y, rng):  # one draw per batch from the generator given, as task.augment
        return (x.flip(-1) if torch.randint(2, (1,), generator=rng) else x), y

    def augmented(config):
        data = load(config)
        data.augment = flip
        return data

    monkeypatch.setattr(synthetic, "load", augmented)
    config = tiny(
        rounds=1,
        checkpoint=True,
        batch_size=1,
        local={"workers": 1},
        dp={"level": "sample", "noise_multiplier": 1.0},
    )
    run(config, out=tmp_path / "a")
    run(config, out=tmp_path / "b")
    a, b = _client_streams(tmp_path / "a"), _client_streams(tmp_path / "b")
    assert a and a.keys() == b.keys()
    assert all(torch.equal(a[c], b[c]) for c in a)


def test_simulated_time_is_refused_under_secret_client_sampling(tmp_path):
    """A round's simulated time and outages say which sites trained."""
    sites = str(Path(__file__).parents[1] / "examples" / "sites" / "rural.yaml")
    dp = {"level": "client", "noise_multiplier": 1.0}
    with pytest.raises(FedkitError, match="sites .simulated time. cannot run"):
        run(tiny(rounds=1, sample_fraction=0.5, sites=sites, dp=dp), out=tmp_path / "run")
