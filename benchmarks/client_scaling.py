"""Cost with the number of clients: the same data and the same sampled work split over 10,
100 and 1,000 clients.

Each run is ``fedkit_core.run`` of the synthetic task with ``partition.kind=iid``,
``sample_fraction=0.1`` (a tenth of the data trains each round, whatever N) and N clients,
in a fresh process. Printed per N: setup (engine wall time before round 1), first round,
steady round (median of rounds 2..), peak PSS of the process tree, and each as a ratio to
10 clients (targets: 100 clients <= 1.3x, 1,000 clients <= 2x, memory <= 1.5x); then the
same times in process CPU seconds, the fairer measure on a machine shared with others.

    python benchmarks/client_scaling.py [--clients 10,100,1000] [--rounds 3]
        [--head-samples 1500] [--repeats 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from anchor_job import ROOT, run_measured


def config(clients: int, rounds: int, head_samples: int) -> dict:
    return {
        "task": {"name": "synthetic", "head_samples": head_samples},
        "clients": clients,
        "partition.kind": "iid",
        "sample_fraction": 0.1,
        "rounds": rounds,
        "checkpoint": False,
        "seed": 0,
    }


class CpuClock:
    """Process CPU seconds of set-up and of each round (a fair measure on a loaded machine,
    where wall times swing with the other processes)."""

    def __init__(self) -> None:
        self.last = time.process_time()
        self.setup = 0.0
        self.rounds: list[float] = []

    def on_start(self, total_rounds: int, first_round: int) -> None:
        self.setup, self.last = time.process_time() - self.last, time.process_time()

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None: ...

    def on_round_end(self, record: dict) -> None:
        now = time.process_time()
        self.rounds.append(now - self.last)
        self.last = now

    def on_end(self, results, run_dir) -> None: ...


def worker(clients: int, rounds: int, head_samples: int, threads: int, report: Path) -> None:
    import torch

    from fedkit_core import run

    torch.set_num_threads(threads)
    clock = CpuClock()
    results = run(config(clients, rounds, head_samples), observer=clock)
    seconds = [r["seconds"] for r in results.rounds]
    setup = results["final"]["wall_seconds"] - sum(seconds)
    cpu = {"cpu_setup": clock.setup, "cpu_rounds": clock.rounds}
    report.write_text(json.dumps({"rounds": seconds, "setup": setup, **cpu}))


def measure(clients: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, __file__, "--worker", str(clients), "--report", str(report)]
        cmd += ["--rounds", str(args.rounds), "--head-samples", str(args.head_samples)]
        cmd += ["--threads", str(args.threads)]
        env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}", "OMP_NUM_THREADS": str(args.threads)}
        _, peak, error = run_measured(cmd, {**os.environ, **env})
        if error is not None:
            raise SystemExit(f"{clients} clients failed:\n{error}")
        out = json.loads(report.read_text())
    return {
        "setup": out["setup"],
        "first": out["rounds"][0],
        "round": statistics.median(out["rounds"][1:]),
        "pss": peak / 2**20,
        "cpu setup": out["cpu_setup"],
        "cpu first": out["cpu_rounds"][0],
        "cpu round": statistics.median(out["cpu_rounds"][1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", default="10,100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--head-samples", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (1 on a machine shared with others)"
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.rounds, args.head_samples, args.threads, args.report)
        return
    counts = [int(c) for c in args.clients.split(",")]
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    for _ in range(args.repeats):
        for n in counts:  # alternating
            runs[n].append(measure(n, args))
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    base = med[counts[0]]
    print(
        f"synthetic, head_samples={args.head_samples}, iid, sample_fraction=0.1, "
        f"{args.rounds} rounds, {args.threads} threads, medians of {args.repeats}; "
        f"ratios to {counts[0]} clients"
    )
    columns = {
        "setup": "setup s",
        "first": "1st round s",
        "round": "round s",
        "pss": "PSS MiB",
        "cpu setup": "CPU setup s",
        "cpu first": "CPU 1st s",
        "cpu round": "CPU round s",
    }
    for keys in (list(columns)[:4], list(columns)[4:]):
        print(f"{'clients':>8s} " + " ".join(f"{columns[k]:>16s}" for k in keys))
        for n, m in med.items():
            cells = [f"{m[k]:7.2f} ({m[k] / base[k]:4.2f}x)" for k in keys]
            print(f"{n:8d} " + " ".join(f"{c:>16s}" for c in cells))


if __name__ == "__main__":
    main()
