"""Bytes on the wire per round: what each method sends down to and up from a client.

fedkit counts every message's content as serialised (arrays' data, scalars, names) on every
engine; this script runs a few methods on the same task and prints the mean bytes per
client per round, down and up, and the ratio of each to FedAvg's. Fed-LWR's extra round trip
(anchor down, per-layer CKA up) shows as more bytes down.

    python benchmarks/traffic.py [--rounds 2] [--methods fedavg fca fed-lwr]
"""

from __future__ import annotations

import argparse

from fedkit_core import run
from fedkit_core.testing import tiny


def bytes_per_round(method: str, rounds: int, evaluation: str) -> dict[str, float]:
    """Mean bytes per client and round (training and evaluation messages together)."""
    config = tiny(rounds=rounds, eval_every=rounds, evaluation=evaluation, batch_size=32)
    if method != "fedavg":
        config["plugins"] = [method]
    if method == "fed-lwr":
        config["batch_size"] = 32
    results = run(config)
    per_client = [c for r in results.rounds for c in r["bytes"].values()]
    return {way: sum(c[way] for c in per_client) / len(per_client) for way in ("down", "up")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=["fedavg", "fca", "fed-lwr"])
    parser.add_argument("--evaluation", default="pooled", choices=("pooled", "federated"))
    args = parser.parse_args()
    rows = {m: bytes_per_round(m, args.rounds, args.evaluation) for m in args.methods}
    base = rows[args.methods[0]]
    print(f"{'method':10} {'down kB':>10} {'up kB':>10} {'down x':>8} {'up x':>8}")
    for method, row in rows.items():
        print(
            f"{method:10} {row['down'] / 1e3:10.1f} {row['up'] / 1e3:10.1f} "
            f"{row['down'] / base['down']:8.2f} {row['up'] / base['up']:8.2f}"
        )


if __name__ == "__main__":
    main()
