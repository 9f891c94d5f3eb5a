"""The cost of differential privacy on the anchor job (``benchmarks/anchor_job.py``: its data
split, CNN, optimiser and config, on fedkit's local engine).

Variants, each a fresh process, run in alternation ``--repeats`` times:

* ``plain``: the anchor job as it is;
* ``client``: ``dp.level=client`` (DP-FedAvg: clipping on the clients, noise on the sum),
  ``dp.noise_multiplier=1``;
* ``sample-ghost``: ``dp.level=sample`` (DP-SGD on every client through Opacus: per-sample
  clipping, noise, Poisson batches), ``dp.noise_multiplier=1``, by ghost clipping
  (``dp.grad_sample=ghost``, what ``auto`` picks for this job);
* ``sample-hooks``: the same with Opacus's stored per-sample gradients
  (``dp.grad_sample=hooks``).

``sample`` stands for both sample-level variants.

Printed: the steady round (median of rounds 2 to ROUNDS-1, as anchor_job times them) and the
wall time of each variant, their medians over repeats, and the paired ratio of each private
variant's steady round to the plain one's (per repeat: both ran back to back), as the
geometric mean with its 95% interval (anchor_job's :func:`paired_ratio`). Targets: client
level within 1.1x a plain round, sample level within 2x.

    python benchmarks/dp_cost.py [--repeats 3] [--variants plain,client,sample]
    python benchmarks/dp_cost.py --variants plain,sample-ghost --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import anchor_job  # noqa: E402  (the anchor job's machinery)

VARIANTS = {
    "plain": {},
    "client": {"dp.level": "client", "dp.noise_multiplier": 1.0, "dp.clip": 1.0},
    "sample-ghost": {
        "dp.level": "sample",
        "dp.noise_multiplier": 1.0,
        "dp.clip": 1.0,
        "dp.grad_sample": "ghost",
    },
    "sample-hooks": {
        "dp.level": "sample",
        "dp.noise_multiplier": 1.0,
        "dp.clip": 1.0,
        "dp.grad_sample": "hooks",
    },
}
#: a name on --variants that stands for several variants
ALIASES = {"sample": ["sample-ghost", "sample-hooks"]}
TARGETS = {"client": 1.1, "sample-ghost": 2.0, "sample-hooks": 2.0}


class CpuClock:
    """Process CPU seconds (user + system, every thread) spent in each round: the cost of a
    round whatever else the machine runs (wall time swings with the load of a shared CPU)."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_start(self, total_rounds: int, first_round: int) -> None:
        self.marks = [time.process_time()]

    def on_phase(self, *args: object) -> None: ...

    def on_round_end(self, record: dict) -> None:
        self.marks.append(time.process_time())

    def on_end(self, *args: object) -> None: ...

    def rounds(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def worker(variant: str, sites: Path, seed: int, rounds: int, report: Path) -> None:
    import torch

    from fedkit_core import run

    torch.set_num_threads(anchor_job.THREADS)
    config = {
        **anchor_job.fedkit_config(sites, seed, "local"),
        "rounds": rounds,
        "eval_every": rounds,
        **VARIANTS[variant],
    }
    clock = CpuClock()
    results = run(config, observer=clock)
    report.write_text(
        json.dumps(
            {
                "rounds": [r["seconds"] for r in results.rounds],
                "cpu_rounds": clock.rounds(),
                "accuracy": results.rounds[-1]["global"]["acc"],
                "epsilon": results.final.get("privacy", {}).get("epsilon"),
            }
        )
    )


def measure(variant: str, sites: Path, seed: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--worker", variant, "--sites", str(sites),
             "--seed", str(seed), "--rounds", str(rounds), "--report", str(report)],
            check=True,
            cwd=HERE,
        )  # fmt: skip
        wall = time.perf_counter() - start
        out = json.loads(report.read_text())
    steady = out["rounds"][1:-1] or out["rounds"]
    cpu = out["cpu_rounds"][1:-1] or out["cpu_rounds"]
    return {**out, "wall": wall, "round": statistics.median(steady), "cpu": statistics.median(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default="plain,client,sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds", type=int, default=anchor_job.ROUNDS, help="rounds per run (steady: 2..n-1)"
    )
    parser.add_argument("--data", type=Path, default=anchor_job.DATA)
    parser.add_argument("--worker", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--sites", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.sites, args.seed, args.rounds, args.report)
        return
    variants = [x for v in args.variants.split(",") if v for x in ALIASES.get(v, [v])]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    repeats: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        sites = anchor_job.write_sites(args.data, args.seed, Path(tmp) / "anchor_sites.npz")
        for k in range(args.repeats):
            repeats.append({})
            for variant in variants:  # alternating: load drift spreads over every variant
                r = measure(variant, sites, args.seed, args.rounds)
                repeats[-1][variant] = r
                print(
                    f"  [{k + 1}/{args.repeats}] {variant}: wall {r['wall']:.1f} s, round "
                    f"{r['round']:.2f} s (CPU {r['cpu']:.2f} s), acc {r['accuracy']:.4f}, "
                    f"epsilon {r['epsilon']}",
                    file=sys.stderr,
                )
    print(
        f"dp cost on the anchor job: {anchor_job.CLIENTS} clients, {args.rounds} rounds, "
        f"medians of {args.repeats} repeats"
    )
    print(
        f"{'variant':12s} {'wall s':>8s} {'round s':>8s} {'CPU s':>8s} {'accuracy':>9s} "
        f"{'epsilon':>8s}"
    )
    for variant in variants:
        runs = [rep[variant] for rep in repeats]
        eps = runs[0]["epsilon"]
        print(
            f"{variant:12s} {statistics.median(r['wall'] for r in runs):8.2f} "
            f"{statistics.median(r['round'] for r in runs):8.3f} "
            f"{statistics.median(r['cpu'] for r in runs):8.3f} "
            f"{statistics.median(r['accuracy'] for r in runs):9.4f} "
            f"{'-' if eps is None else f'{eps:.3f}':>8s}"
        )
    if "plain" in variants:
        for variant, target in TARGETS.items():
            if variant not in variants:
                continue
            for key, what in (("round", "wall"), ("cpu", "CPU")):
                values = [rep[variant][key] for rep in repeats]
                baseline = [rep["plain"][key] for rep in repeats]
                if len(values) < 2:
                    ratio = values[0] / baseline[0]
                    print(
                        f"{variant} / plain steady round ({what}): {ratio:.3f} (1 repeat; "
                        f"target <= {target})"
                    )
                    continue
                mean, low, high = anchor_job.paired_ratio(values, baseline)
                print(
                    f"{variant} / plain steady round ({what}): {mean:.3f} (95% CI "
                    f"{low:.3f}-{high:.3f}, {len(values)} paired repeats; target <= {target})"
                )


if __name__ == "__main__":
    main()
