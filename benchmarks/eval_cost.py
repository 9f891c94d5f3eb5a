"""The cost of evaluating every round: the default run (``eval_every=1``) against the same
run evaluated only at the end (``eval_every=rounds``).

Each run is the default run as ``fedkit run`` makes it (the ``synthetic`` task, its 4 sites
as clients, checkpoints and results written to a run directory after every round, plots at
the end), in a fresh process, the modes alternating:

* ``improved``: ``eval_every=1`` with ``eval_test=improved`` (the default: validation every
  round, the test split only in rounds whose validation makes them the best so far, and in
  the last);
* ``every``: ``eval_every=1`` with ``eval_test=every`` (both splits every round);
* ``end``: ``eval_every=rounds`` (the last round only).

Printed per mode (medians of the repeats): the wall and the CPU seconds (all threads) of the
process's ``fedkit_core.run`` call, the engine's own wall (``final.wall_seconds``: setup and
rounds, without the results written between rounds), the rounds that scored the test split,
and the ratios to ``end`` (target <= 1.10x); then whether the final results (global,
clients, clients' mean, fairness, summary, views) of the three modes, and the best round and
its results of ``improved`` and ``every``, are identical (they must be). The load average
is printed before and after: on a shared machine the CPU seconds are the steadier figure.

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
MODES = ("improved", "every", "end")
#: the parts of ``final`` every mode must reproduce (``best`` is compared separately)
FINAL = ("round", "global", "clients", "clients_mean", "fairness", "summary", "views")


def config(mode: str, rounds: int, extra: list[str]) -> dict:
    values: dict = {"rounds": rounds, "seed": 0}
    if mode == "end":
        values["eval_every"] = rounds
    else:
        values.update(eval_every=1, eval_test=mode)
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
    from fedkit_core.results.schema import has_test

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        cpu, wall = time.process_time(), time.perf_counter()
        results = run(cfg, out=Path(tmp) / "run")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    final = results.final
    best = final.get("best", {})
    report.write_text(
        json.dumps(
            {
                "wall": wall,
                "cpu": cpu,
                "engine": final["wall_seconds"],
                "final": {k: final.get(k) for k in FINAL},
                "best": best,
                "tested": sum(has_test(r) for r in results.rounds),
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


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # not on Linux
        return "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="a subset of " + ",".join(MODES))
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
    modes = [m for m in MODES if m in args.modes.split(",")]
    print(f"load average before: {loadavg()}", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            runs[mode].append(measure(config(mode, args.rounds, args.set), args.threads))
    print(f"load average after:  {loadavg()}")
    print(
        f"{args.rounds} rounds {' '.join(args.set)}, {args.threads} threads, medians of "
        f"{args.repeats}; seconds of the run() call (wall, process CPU) and of the engine"
    )
    med = {
        m: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "engine")}
        for m, rs in runs.items()
    }
    for mode in modes:
        m, tested = med[mode], runs[mode][0]["tested"]
        line = f"{mode:9s} {m['wall']:8.2f} wall {m['cpu']:8.2f} CPU {m['engine']:8.2f} engine"
        line += f"  test scored in {tested}/{args.rounds} rounds"
        if "end" in med and mode != "end":
            ratio = {k: m[k] / med["end"][k] for k in m}
            line += (
                f"  ratio to end: {ratio['wall']:.3f}x wall {ratio['cpu']:.3f}x CPU "
                f"{ratio['engine']:.3f}x engine"
            )
        print(line)
    first = {mode: rs[0] for mode, rs in runs.items()}
    same_final = all(r["final"] == first[modes[0]]["final"] for r in first.values())
    print(f"final results identical across modes: {same_final}")
    if "improved" in first and "every" in first:
        same_best = first["improved"]["best"] == first["every"]["best"]
        print(
            f"best round ({first['every']['best'].get('round')}) and its results identical "
            f"(improved, every): {same_best}"
        )


if __name__ == "__main__":
    main()
