"""Cost of writing the running records after a round, at round 1 and at the last round of a
long run with many clients.

One real round is run first (``fedkit_core.run`` of the synthetic task, ``partition.kind=
iid``, N clients, 1 round, in memory): its record is copied into ``--rounds`` rounds (each
a separate object with its own round number, as the server keeps them). Then, at round 1
and at the last round, the write that follows a round is timed (process CPU seconds and
wall seconds, best of ``--repeats``):

* ``whole``: ``write_json`` of all the results, as every round's write was before
  :class:`~fedkit_core.results.store.ResultsWriter` (``json.dumps`` of the whole history);
* ``pieces``: ``ResultsWriter.write_json`` having written the rounds before (their text
  kept);
* ``metrics.csv``, written after each round too: the whole ``metrics_csv`` text of the
  records so far (before), and ``ResultsWriter.metrics.text`` having made the rounds
  before (after).

The files (texts) of both ways are checked to be identical.

    python benchmarks/results_write.py [--clients 1000] [--rounds 100] [--head-samples 150]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedkit_core import run
from fedkit_core.results.schema import build_results, metrics_csv
from fedkit_core.results.store import ResultsWriter, write_json


def timed(
    work: Callable[[Any], object], repeats: int, prepare: Callable[[], Any] = lambda: None
) -> tuple[float, float]:
    """Best process CPU seconds and best wall seconds of ``repeats`` calls of ``work`` on
    what ``prepare`` returns (prepared afresh for each call, untimed)."""
    cpu, wall = [], []
    for _ in range(repeats):
        arg = prepare()
        c, w = time.process_time(), time.perf_counter()
        work(arg)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return min(cpu), min(wall)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--head-samples", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    config = {
        "task": {"name": "synthetic", "head_samples": args.head_samples},
        "clients": args.clients,
        "partition.kind": "iid",
        "sample_fraction": 0.1,
        "rounds": 1,
        "seed": 0,
    }
    done = run(config)
    records = []
    for rnd in range(1, args.rounds + 1):
        record = copy.deepcopy(done.rounds[0])
        record["round"] = rnd
        records.append(record)

    def results(k: int) -> dict:
        return build_results(
            status="running",
            config=done["config"],
            plugins=done["plugins"],
            task=done["task"],
            device=done["device"],
            records=records[:k],
            events=[],
            wall_seconds=1.0,
            setup_bytes=done["setup_bytes"],
        )

    print(
        f"synthetic, {args.clients} clients, one round's record copied into {args.rounds} "
        f"rounds; per write after a round: best of {args.repeats}, CPU s / wall s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        whole, pieces = Path(tmp) / "whole.json", Path(tmp) / "pieces.json"
        for k in (1, args.rounds):
            res = results(k)
            before = results(k - 1)

            def writer(before: dict = before) -> ResultsWriter:
                """A writer that wrote the rounds before (their text kept)."""
                out = ResultsWriter()
                out.pieces(before)
                out.metrics.text(before["rounds"])
                return out

            old = timed(lambda _, res=res: write_json(whole, res), args.repeats)
            new = timed(lambda w, res=res: w.write_json(pieces, res), args.repeats, writer)
            csv_old = timed(lambda _, k=k: metrics_csv(records[:k]), args.repeats)
            csv_new = timed(lambda w, k=k: w.metrics.text(records[:k]), args.repeats, writer)
            same = whole.read_bytes() == pieces.read_bytes()
            same_csv = metrics_csv(records[:k]) == writer().metrics.text(records[:k])
            print(
                f"round {k:4d}: results.json {whole.stat().st_size / 2**20:6.2f} MB, whole "
                f"{old[0]:6.3f} / {old[1]:6.3f}, pieces {new[0]:6.3f} / {new[1]:6.3f}, "
                f"byte-identical: {same}; metrics.csv whole {csv_old[0]:6.3f} / "
                f"{csv_old[1]:6.3f}, pieces {csv_new[0]:6.3f} / {csv_new[1]:6.3f}, "
                f"identical: {same_csv}"
            )


if __name__ == "__main__":
    main()
