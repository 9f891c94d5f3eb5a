"""The prior's extra cost: wall time of a Fed-MAS round over a FedAvg round, same data, same
process, same optimiser.

Fed-MAS adds per round and client one eval pass of the received model and the prior over the
local training data (``w_k``), plus a prior forward pass, the projector and the aux head at
every training step. Without augmentation the prior's features are cached per sample
(``cache_prior``, default), so the prior itself runs once per sample; ``fed-mas/nocache``
recomputes them at every pass, as with an augmenting task. Rounds are timed without evaluation (``eval_every`` beyond the last
round; the first and last rounds are left out) and the methods alternate ``--repeats`` times
so that load from other processes hits them alike. Prints the median seconds per round and
the ratios to FedAvg.

    OMP_NUM_THREADS=1 python benchmarks/fed_mas_prior_cost.py \
        --data ../shared/data/medmnist/retinamnist.npz --rounds 6 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from fedkit_core import run

ROOT = Path(__file__).resolve().parents[1]
PRIOR = ROOT.parent / "shared" / "data" / "weights" / "cifar10_resnet" / "resnet20-12fca82f.th"


def base_config(args: argparse.Namespace) -> dict:
    task = (
        {"name": "npz", "path": args.data}
        if args.data
        else {"name": "synthetic", "sites": 4, "head_samples": 150}
    )
    return {
        "task": task,
        "rounds": args.rounds,
        "eval_every": args.rounds + 1,  # only the (excluded) last round evaluates
        "clients": args.clients if args.data else None,
        "partition": {"kind": "dirichlet", "alpha": 0.5} if args.data else {},
        "model": args.model,
        "loss": "bsm",
        "batch_size": 32,
        "optimizer": "adam",
        "lr": 1e-3,
        "keep_optimizer_state": True,
        "grad_clip": 5.0,
        "checkpoint": False,
    }


def methods(args: argparse.Namespace) -> dict[str, dict]:
    prior = {"prior": args.prior, "prior_weights": args.prior_weights}
    return {
        "fedavg-bsm": {},
        "bsm+kd": {"plugins": ["fed-mas"], "fed-mas": {**prior, "aggregation": "fedavg"}},
        "fed-mas": {"plugins": ["fed-mas"], "fed-mas": {**prior, "aggregation": "mas"}},
        "fed-mas/nocache": {
            "plugins": ["fed-mas"],
            "fed-mas": {**prior, "aggregation": "mas", "cache_prior": False},
        },
    }


def round_seconds(config: dict) -> list[float]:
    results = run(config)
    return [r["seconds"] for r in results["rounds"][1:-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a MedMNIST-format .npz (default: the synthetic task)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--prior", default="cifar-resnet20")
    parser.add_argument("--prior-weights", default=str(PRIOR) if PRIOR.is_file() else "random")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (the first and last rounds are not timed)")
    seconds: dict[str, list[float]] = {name: [] for name in methods(args)}
    for _ in range(args.repeats):
        for name, layer in methods(args).items():
            seconds[name] += round_seconds({**base_config(args), **layer})
    base = statistics.median(seconds["fedavg-bsm"])
    print(
        f"task {args.data or 'synthetic'}, model {args.model}, prior {args.prior} "
        f"({args.prior_weights}), torch threads {torch.get_num_threads()}, "
        f"{len(seconds['fedavg-bsm'])} timed rounds per method"
    )
    print(f"{'method':<16} {'s/round':>8} {'ratio to FedAvg':>16}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:<16} {median:>8.3f} {median / base:>16.2f}")


if __name__ == "__main__":
    main()
