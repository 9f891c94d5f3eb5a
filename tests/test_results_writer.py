"""The running records written after each round from kept pieces (``ResultsWriter``): byte
for byte what ``json.dumps`` of the whole results and ``metrics_csv`` of all records give."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedkit_core import run
from fedkit_core.results.schema import metrics_csv
from fedkit_core.results.store import ResultsWriter, RunDir, _jsonable
from fedkit_core.testing import tiny


def plain(results) -> bytes:
    """results.json as written whole."""
    return (json.dumps(results, indent=2, default=_jsonable) + "\n").encode()


def scopes(seed: int, clients: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    per = {f"c{i}": {"acc": float(rng.random()), "bacc": rng.random()} for i in range(clients)}
    return {"global": {"acc": float(rng.random())}, "clients": per, "views": {}}


def record(rnd: int) -> dict:
    """A round record: numpy values, odd strings, empty containers, and test and val scores
    (the test scopes at the top, as the server keeps them)."""
    return {
        "round": rnd,
        "sampled": [f"c{rnd % 3}"],
        "train": {"c0": {"loss": np.float32(0.5) / rnd}},
        "note": 'quote " newline \n tab \t é ✓',
        "empty": {},
        "none": [],
        **scopes(rnd),
        "val": scopes(100 + rnd),
        "seconds": 0.1 * rnd,
    }


def results(records: list) -> dict:
    last = records[-1] if records else {}
    return {
        "status": "running",
        "config": {"rounds": 9, "nested": {"list": [1, 2.5, None, True]}},
        "rounds": records,
        "events": [],
        "final": {"round": last.get("round"), "clients": last.get("clients", {})},
    }


def check(writer: ResultsWriter, res: dict) -> None:
    assert b"".join(writer.pieces(res)) == plain(res)
    assert writer.metrics.text(res["rounds"]) == metrics_csv(res["rounds"])


def test_the_pieces_are_the_whole_dump_as_rounds_come_and_change():
    writer, records = ResultsWriter(), []
    check(writer, results(records))  # no round yet: "rounds": []
    for rnd in range(1, 5):
        records.append(record(rnd))
        check(writer, results(records))
    # an earlier round's test scores set later (eval_test=improved), a new metric column
    records[1].update({"global": {"acc": 0.25, "new_metric": 1.0}, "evaluated": ["val", "test"]})
    check(writer, results(records))
    records[2]["seconds"] = 9.0  # a top-level value replaced
    check(writer, results(records))
    del records[0]["note"]  # a key removed
    check(writer, results(records))
    records[:] = [json.loads(json.dumps(r, default=_jsonable)) for r in records]  # resumed
    check(writer, results(records))
    check(writer, results(records[:2]))  # fewer rounds (another run's records)
    check(writer, results([]))


def test_an_unchanged_round_is_not_serialised_again(monkeypatch):
    """The cost that grows with the rounds is gone: only the new round is serialised."""
    import fedkit_core.results.store as store

    writer, records = ResultsWriter(), [record(1), record(2)]
    writer.pieces(results(records))
    dumped = []
    real = store._dumps
    monkeypatch.setattr(
        store, "_dumps", lambda value, level: dumped.append(value) or real(value, level)
    )
    records.append(record(3))
    writer.pieces(results(records))
    assert [v for v in dumped if isinstance(v, dict) and "sampled" in v] == [records[2]]


@pytest.mark.slow
def test_every_write_of_a_run_is_the_whole_dump(tmp_path, monkeypatch):
    """A run whose last round scores the test split of an earlier one (eval_test=improved
    keeps the best round's model untested): after every round, results.json and
    metrics.csv are those of writing everything whole."""
    writes = []
    real = ResultsWriter.write

    def write(self, run_dir: RunDir, res) -> None:
        real(self, run_dir, res)
        assert run_dir.results.read_bytes() == plain(res)
        assert run_dir.metrics_csv.read_bytes() == metrics_csv(res["rounds"]).encode()
        writes.append([r.get("evaluated") for r in res["rounds"]])

    monkeypatch.setattr(ResultsWriter, "write", write)
    done = run(tiny(rounds=6, lr=3e-3), out=tmp_path / "run")
    assert len(writes) == 7  # after each round, then complete
    # round 5 (the best) was written untested, then rewritten with its test scores
    assert writes[4][4] == ["val"] and writes[-1][4] == ["val", "test"]
    assert (tmp_path / "run" / "results.json").read_bytes() == plain(done)
