"""How much of a Fed-LWR round its CKA step costs (same process, same run).

Times each round's phases from the engine's progress events: *train* (local training of
every client plus the uniform anchor average, which FedAvg's own aggregation also costs)
and *cka* (the anchor round trip: every client's per-layer CKA on its validation split,
plus the layer-wise re-aggregation). Evaluation is excluded (it runs only in the last
round here) and reported separately. Prints per-round seconds and the CKA share of the
rounds after the first (warm-up). On a shared machine, ``OMP_NUM_THREADS=1`` gives steadier
numbers.

    PYTHONPATH=. python benchmarks/fed_lwr_cost.py                       # synthetic-seg
    PYTHONPATH=. python benchmarks/fed_lwr_cost.py --rounds 3 \\
        --set task.name=npz-seg --set task.path=../shared/data/seg/drive_chasedb1_512.npz \\
        --set task.image_size=128
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from fedkit_core import run
from fedkit_core.contract.observer import Observer

QUERY = "fed-lwr.cka"


class PhaseClock(Observer):
    """Wall-clock time at which each phase of each round starts."""

    def __init__(self) -> None:
        self.marks: dict[int, dict[str, float]] = {}

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None:
        if done == 0:
            self.marks.setdefault(round, {}).setdefault(phase, time.perf_counter())

    def on_round_end(self, record: dict[str, Any]) -> None:
        self.marks[record["round"]]["end"] = time.perf_counter()

    def split(self, round: int) -> dict[str, float]:
        m = self.marks[round]
        after_cka = m.get("evaluate", m["end"])
        return {
            "train": m[QUERY] - m["train"],
            "cka": after_cka - m[QUERY],
            "evaluate": m["end"] - after_cka,
        }


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="config key=value")
    args = parser.parse_args()
    config = {
        "task.name": "synthetic-seg",
        "plugins": ["fed-lwr"],
        "rounds": args.rounds,
        "eval_every": 10**6,
        "checkpoint": False,
        **parse_sets(args.set),
    }
    clock = PhaseClock()
    results = run(config, observer=clock)
    cfg = results["config"]
    task = cfg["task"]
    print(
        f"task {task['name']} ({len(results.final['clients'])} clients), model {cfg['model']}, "
        f"batch {cfg['batch_size']}, fed-lwr {cfg['fed-lwr']}"
    )
    print(f"{'round':>5} {'train s':>8} {'cka s':>7} {'eval s':>7} {'cka share':>9}")
    splits = {rnd: clock.split(rnd) for rnd in sorted(clock.marks)}
    for rnd, s in splits.items():
        share = s["cka"] / (s["train"] + s["cka"])
        print(f"{rnd:>5} {s['train']:>8.2f} {s['cka']:>7.2f} {s['evaluate']:>7.2f} {share:>9.1%}")
    # round 1 also pays one-off costs (first calls, allocator warm-up): leave it out
    steady = [s for rnd, s in splits.items() if rnd > 1] or list(splits.values())
    train = sum(s["train"] for s in steady)
    cka = sum(s["cka"] for s in steady)
    print(
        f"CKA share of training+aggregation time, rounds 2-{len(splits)}: {cka / (train + cka):.1%}"
    )


if __name__ == "__main__":
    main()
