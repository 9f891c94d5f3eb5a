"""What Fed-MAS's rescue factors do on a data set: per-class distances and aggregation weights.

Runs Fed-MAS with a spy plugin and prints, per client, its training size, the classes it has,
its FedAvg weight (share of samples) and its MAS weight (``RF_c / sum RF``) in the first and
last round, then per-class ``w_k`` (averaged over the clients that have the class) and their
rank correlation with the global class frequency (the paper's Fig. 2a: ``w_k`` is high for
rare classes).

    OMP_NUM_THREADS=1 python benchmarks/fed_mas_weights.py \
        --data ../shared/data/medmnist/retinamnist.npz --rounds 10
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from fedkit_core import hookimpl, run

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ROOT / "examples" / "fed-mas" / "offline.yaml"


class Spy:
    """Records each client's per-class ``w_k``, ``w_hat_k`` and class counts every round."""

    def __init__(self) -> None:
        self.rounds: dict[int, dict[str, dict]] = {}

    @hookimpl
    def fedkit_client_report(self, client):
        state = client.state["fed-mas"]
        w = (state["w_sum"] / state["w_count"].clamp_min(1)).cpu().numpy()
        w_hat = (state["w_hat_sum"] / state["w_hat_count"].clamp_min(1)).cpu().numpy()
        present = (state["w_count"] > 0).cpu().numpy()
        self.rounds.setdefault(client.round, {})[client.id] = {
            "w": np.where(present, w, np.nan),
            "w_hat": np.where(present, w_hat, np.nan),
            "counts": np.asarray(client.class_counts),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="extra key=value config pairs")
    args = parser.parse_args()
    from fedkit_core.config import parse_sets

    spy = Spy()
    config = [
        str(OFFLINE),
        {"task": {"name": "npz", "path": args.data}, "rounds": args.rounds, "seed": args.seed},
        {"checkpoint": False, "eval_every": args.rounds},
        parse_sets(args.set),
    ]
    results = run(config, plugins={"spy": spy})
    final = results.final["global"]
    print(
        f"final global bACC {final['bacc']:.4f}"
        + (f", tail acc {final['tail_acc']:.4f}" if "tail_acc" in final else "")
    )
    for rnd in (1, args.rounds):
        clients = spy.rounds[rnd]
        train = results["rounds"][rnd - 1]["train"]
        sizes = {cid: c["counts"].sum() for cid, c in clients.items()}
        rf = {cid: train[cid]["fed-mas.rf"] for cid in clients}
        print(f"\nround {rnd}")
        print(f"{'client':<7} {'n':>5} {'classes':>8} {'RF':>7} {'MAS w':>7} {'FedAvg w':>9}")
        for cid, c in clients.items():
            print(
                f"{cid:<7} {sizes[cid]:>5} {int((c['counts'] > 0).sum()):>8} {rf[cid]:>7.4f} "
                f"{rf[cid] / sum(rf.values()):>7.3f} {sizes[cid] / sum(sizes.values()):>9.3f}"
            )
        w = np.nanmean(np.stack([c["w"] for c in clients.values()]), axis=0)
        w_hat = np.nanmean(np.stack([c["w_hat"] for c in clients.values()]), axis=0)
        freq = sum(c["counts"] for c in clients.values())
        rho = spearmanr(w, freq).correlation
        print("class     " + " ".join(f"{k:>7}" for k in range(len(w))))
        print("n global  " + " ".join(f"{n:>7}" for n in freq))
        print("w_k       " + " ".join(f"{v:>7.4f}" for v in w))
        print("w_hat_k   " + " ".join(f"{v:>7.4f}" for v in w_hat))
        print(f"Spearman(w_k, class frequency) = {rho:+.2f}")


if __name__ == "__main__":
    main()
