"""Parallel clients on the local engine: the anchor job (``anchor_job.py``) with its clients
in this process versus in worker processes (``local.workers``, ``local.threads``).

Settings are ``WORKERSxTHREADS``: ``0x2`` is the anchor job as it is (clients one after the
other in the engine's process, 2 torch threads); ``2x1`` runs them in 2 worker processes of 1
thread each, ``5x2`` in 5 workers of 2 threads. Each setting runs in a fresh process, in
alternation, ``--repeats`` times; printed are the medians of process wall time, steady round
(rounds 2..) and peak PSS of the process tree, the test accuracy, whether the final metrics
equal the first setting's bit for bit, and the ratios to the first setting.

    python benchmarks/parallel_clients.py [--settings 0x2,2x1,2x2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from anchor_job import DATA, ROOT, fedkit_config, run_measured, write_sites


def parse(setting: str) -> tuple[int, int]:
    workers, _, threads = setting.partition("x")
    return int(workers), int(threads)


def worker(sites: Path, seed: int, setting: str, report: Path, rounds: int | None) -> None:
    """One run of the job at ``setting``; writes its round times and final metrics."""
    import torch

    from fedkit_core import run

    workers, threads = parse(setting)
    torch.set_num_threads(threads)
    config = fedkit_config(sites, seed, "local")
    config["local.workers"] = workers
    if rounds:
        config.update(rounds=rounds, eval_every=rounds)
    results = run(config)
    final = results.rounds[-1]["global"]
    report.write_text(
        json.dumps({"rounds": [r["seconds"] for r in results.rounds], "final": final})
    )


def measure(sites: Path, seed: int, setting: str, rounds: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "benchmarks"), str(ROOT), os.environ.get("PYTHONPATH", "")]
            ),
        }
        cmd = [sys.executable, __file__, "--worker", setting, "--sites", str(sites)]
        cmd += ["--seed", str(seed), "--report", str(report), "--rounds", str(rounds or 0)]
        wall, peak, error = run_measured(cmd, env)
        if error is not None:
            raise SystemExit(f"{setting} failed:\n{error}")
        out = json.loads(report.read_text())
    steady = out["rounds"][1:] or out["rounds"]
    return {"wall": wall, "round": statistics.median(steady), "pss": peak, "final": out["final"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", default="0x2,2x1,2x2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--rounds", type=int, default=0, help="fewer rounds (a quick check)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sites", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.sites, args.seed, args.worker, args.report, args.rounds or None)
        return
    settings = [s for s in args.settings.split(",") if s]
    for setting in settings:
        parse(setting)  # fail early on a typo
    runs: dict[str, list[dict]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        sites = write_sites(args.data, args.seed, Path(tmp) / "anchor_sites.npz")
        for repeat in range(args.repeats):
            for setting in settings:  # alternating: other load spreads over every setting
                r = measure(sites, args.seed, setting, args.rounds or None)
                runs[setting].append(r)
                print(
                    f"  [{repeat + 1}/{args.repeats}] {setting}: wall {r['wall']:.1f} s, "
                    f"round {r['round']:.2f} s, acc {r['final']['acc']:.4f}",
                    file=sys.stderr,
                )
    reference = runs[settings[0]][0]["final"]
    print(f"anchor job on the local engine, seed {args.seed}, {os.cpu_count()} CPUs, medians")
    print(
        f"{'workers x threads':18s} {'wall s':>7s} {'round s':>8s} {'PSS MiB':>8s} "
        f"{'accuracy':>9s} {'bitwise':>8s} {'wall x':>7s} {'round x':>8s}"
    )
    base = None
    for setting, rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in ("wall", "round", "pss")}
        base = base or m
        same = all(r["final"] == reference for r in rs)
        print(
            f"{setting:18s} {m['wall']:7.2f} {m['round']:8.3f} {m['pss'] / 2**20:8.0f} "
            f"{rs[0]['final']['acc']:9.4f} {'same' if same else 'differs':>8s} "
            f"{m['wall'] / base['wall']:7.3f} {m['round'] / base['round']:8.3f}"
        )


if __name__ == "__main__":
    main()
