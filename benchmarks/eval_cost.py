"""The cost of evaluating every round: the default run with ``eval_every=1`` (the default)
against the same run evaluated only at the end (``eval_every=rounds``).

Each run is ``fedkit_core.run`` of the given task (default: the default ``synthetic`` run,
its 4 sites as clients) in a fresh process, alternating, checkpoints off. Printed: the
engine's wall time of each (setup and rounds; median of the repeats), their ratio (target
<= 1.10x), and whether the final and best-round test metrics of the two are identical (they
must be: the best round is chosen on validation, and with evaluation only at the end it is
the last round, so the comparison is of the final metrics only).

    python benchmarks/eval_cost.py [--rounds 20] [--repeats 3] [--threads 2] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def config(rounds: int, eval_every: int, extra: list[str]) -> dict:
    values: dict = {"rounds": rounds, "eval_every": eval_every, "checkpoint": False, "seed": 0}
    for item in extra:
        key, _, value = item.partition("=")
        try:
            values[key] = json.loads(value)
        except ValueError:
            values[key] = value
    return values


def worker(cfg: dict, threads: int, report: Path) -> None:
    import torch

    from fedkit_core import run

    torch.set_num_threads(threads)
    cpu = time.process_time()
    results = run(cfg)
    cpu = time.process_time() - cpu
    final = results.final
    report.write_text(
        json.dumps(
            {
                "wall": final["wall_seconds"],
                "cpu": cpu,
                "final": final["global"],
                "rounds": [r["seconds"] for r in results.rounds],
            }
        )
    )


def measure(cfg: dict, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, __file__, "--worker", json.dumps(cfg), "--report", str(report)]
        cmd += ["--threads", str(threads)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
        subprocess.run(cmd, env=env, check=True)
        return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (1 on a machine shared with others)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker), args.threads, args.report)
        return
    every = config(args.rounds, 1, args.set)
    end = config(args.rounds, args.rounds, args.set)
    runs: dict[str, list[dict]] = {"every": [], "end": []}
    for _ in range(args.repeats):
        runs["every"].append(measure(every, args.threads))
        runs["end"].append(measure(end, args.threads))
    wall = {k: statistics.median(r["wall"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu"] for r in v) for k, v in runs.items()}
    same = runs["every"][0]["final"] == runs["end"][0]["final"]
    print(
        f"{args.rounds} rounds {' '.join(args.set)}, {args.threads} threads, "
        f"medians of {args.repeats}; engine wall and process CPU seconds"
    )
    print(f"eval_every=1:      {wall['every']:7.2f} s wall {cpu['every']:7.2f} s CPU")
    print(f"eval_every=rounds: {wall['end']:7.2f} s wall {cpu['end']:7.2f} s CPU")
    print(
        f"ratio:             {wall['every'] / wall['end']:7.3f}x wall "
        f"{cpu['every'] / cpu['end']:7.3f}x CPU"
    )
    print(f"final test metrics identical: {same}")


if __name__ == "__main__":
    main()
