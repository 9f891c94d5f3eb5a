"""What the virtual clock costs: the same synchronous run with and without site profiles.

With ``aggregation=sync`` a run with ``sites`` trains, aggregates and evaluates exactly as
without them (the clock only adds ``simulated_seconds`` and ``outages`` to the records,
``tests/test_clock.py``), so the difference in round time is the clock's cost. The default
synthetic run (``--set`` for others) runs ``--repeats`` times each way, alternating, each in
a fresh process; printed: the steady round (median of rounds 2..) in wall and process CPU
seconds, peak PSS, the ratio with / without per repeat and its median, and whether the
final results are identical. Then the clock alone: ``Clock.exchange`` of one synchronous
round of ``--micro-clients`` fit messages with the profiles (random failures included), in
microseconds per message.

    python benchmarks/clock_cost.py [--rounds 5] [--repeats 3] [--threads 1]
        [--sites examples/sites/rural.yaml] [--micro-clients 10000] [--set KEY=VALUE ...]
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

import yaml
from anchor_job import ROOT, run_measured
from client_scaling import CpuClock, loadavg


def worker(rounds: int, sites: str | None, extra: dict) -> dict:
    from fedkit_core import run

    clock = CpuClock()
    config = {"rounds": rounds, "checkpoint": False, "seed": 0, **extra}
    if sites:
        config["sites"] = sites
    results = run(config, observer=clock)
    return {
        "rounds": [r["seconds"] for r in results.rounds],
        "cpu_rounds": clock.rounds,
        "final": results.final["global"],
        "simulated": results.final.get("simulated_seconds"),
        "clients": len(results["task"]["client_ids"]),
    }


def measure(sites: str | None, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, __file__, "--worker", "--report", str(report)]
        cmd += ["--rounds", str(args.rounds), "--threads", str(args.threads)]
        cmd += [f"--set={s}" for s in args.set] + (
            [f"--sites={sites}", "--with-sites"] if sites else []
        )
        env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}", "OMP_NUM_THREADS": str(args.threads)}
        _, peak, error = run_measured(cmd, {**os.environ, **env})
        if error is not None:
            raise SystemExit(f"run {'with' if sites else 'without'} sites failed:\n{error}")
        out = json.loads(report.read_text())
    return {
        "round": statistics.median(out["rounds"][1:]),
        "cpu round": statistics.median(out["cpu_rounds"][1:]),
        "pss": peak / 2**20,
        "final": out["final"],
        "simulated": out["simulated"],
        "clients": out["clients"],
    }


def micro(sites: str, clients: int) -> float:
    """Microseconds of ``Clock.exchange`` per fit message, one round of ``clients``."""
    from fedkit_core.contract.messages import Message
    from fedkit_core.engines.clock import Clock
    from fedkit_core.sites import load_sites, parse_sites

    ids = [f"c{k}" for k in range(clients)]
    profiles = parse_sites(load_sites(sites)).assign(ids, seed=0)
    messages = {cid: Message("fit") for cid in ids}
    replies = {cid: Message("fit", scalars={"num_examples": 500}) for cid in ids}
    sizes = dict.fromkeys(ids, (400_000, 400_000))
    clock = Clock(profiles, seed=0, local_epochs=1)
    best = float("inf")
    for _ in range(5):  # rounds one after the other, as a run does
        start = time.perf_counter()
        clock.exchange(messages, dict(replies), sizes)
        clock.take_outages()
        best = min(best, time.perf_counter() - start)
    return best / clients * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sites", default=str(ROOT / "examples" / "sites" / "rural.yaml"))
    parser.add_argument("--micro-clients", type=int, default=10_000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--with-sites", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        extra[key] = yaml.safe_load(value)
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        sites = args.sites if args.with_sites else None
        args.report.write_text(json.dumps(worker(args.rounds, sites, extra)))
        return
    before = loadavg()
    runs: dict[str, list[dict]] = {"without": [], "with": []}
    for _ in range(args.repeats):  # alternating
        runs["without"].append(measure(None, args))
        runs["with"].append(measure(args.sites, args))
    print(
        f"synthetic (set {' '.join(args.set) or 'nothing'}), {args.rounds} rounds, "
        f"{args.threads} threads, {args.repeats} repeats alternating, sites {args.sites}; "
        f"load average {before} before, {loadavg()} after"
    )
    print(f"{'':>8s} {'round s':>9s} {'CPU round s':>12s} {'PSS MiB':>9s} {'simulated s':>12s}")
    for name, rs in runs.items():
        for r in rs:
            simulated = "-" if r["simulated"] is None else f"{r['simulated']:.1f}"
            print(
                f"{name:>8s} {r['round']:9.3f} {r['cpu round']:12.3f} {r['pss']:9.0f} {simulated:>12s}"
            )
    for key in ("round", "cpu round", "pss"):
        ratios = [w[key] / o[key] for w, o in zip(runs["with"], runs["without"])]
        shown = ", ".join(f"{r:.3f}" for r in ratios)
        print(f"with / without, {key}: median {statistics.median(ratios):.3f} ({shown})")
    same = all(w["final"] == o["final"] for w, o in zip(runs["with"], runs["without"]))
    print(f"final results identical with and without sites: {same}")
    per_message = micro(args.sites, args.micro_clients)
    cpu_round = statistics.median(r["cpu round"] for r in runs["without"])
    clients = runs["without"][0]["clients"]
    print(
        f"the clock alone: {per_message:.2f} us per fit message ({args.micro_clients} clients "
        f"a round): for this run's {clients} clients {per_message * clients:.0f} us a round, "
        f"{per_message * 1e-6 * clients / cpu_round:.1e} of its CPU round"
    )


if __name__ == "__main__":
    main()
