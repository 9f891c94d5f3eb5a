"""Membership inference against the global model, with and without differential privacy, on
real data: the anchor job (``benchmarks/anchor_job.py``: PneumoniaMNIST, 10 IID clients, its
CNN and SGD) trained longer so that the plain model overfits, then the loss-threshold attack
(:mod:`fedkit_core.tools.attack`) on its training samples against the same number of
held-out validation samples (drawn from the same pool as MedMNIST's training split).

Variants: ``plain``; ``client`` (DP-FedAvg, noise calibrated to ``--epsilon``); ``sample``
(DP-SGD, calibrated to ``--epsilon`` on every client). Printed per variant: epsilon, test
accuracy, the attack's AUC (0.5: chance) and the mean loss of members and non-members.

    python benchmarks/privacy_attack.py [--rounds 8] [--epochs 2] [--epsilon 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import anchor_job  # noqa: E402


def keep_per_client(sites: Path, keep: int) -> Path:
    """The sites file with only the first ``keep`` training images of each client."""
    import numpy as np

    with np.load(sites) as npz:
        arrays = {k: npz[k] for k in npz.files}
    chosen = np.concatenate(
        [np.flatnonzero(arrays["site"] == s)[:keep] for s in dict.fromkeys(arrays["site"])]
    )
    for key in ("train_images", "train_labels", "site"):
        arrays[key] = arrays[key][chosen]
    out = sites.with_name("anchor_sites_small.npz")
    np.savez(out, **arrays)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--variants", default="plain,client,sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--optimizer",
        default="sgd",
        help="the clients' optimiser (sgd: the anchor job's, lr 0.05; adam: lr 1e-3, which "
        "trains a small split without diverging)",
    )
    parser.add_argument(
        "--train-per-client",
        type=int,
        default=None,
        help="keep this many training images per client (a smaller job that overfits sooner)",
    )
    parser.add_argument("--data", type=Path, default=anchor_job.DATA)
    args = parser.parse_args()

    import torch

    from fedkit_core import run
    from fedkit_core.tools.attack import membership_auc

    torch.set_num_threads(anchor_job.THREADS)
    dp = {"dp.target_epsilon": args.epsilon, "dp.clip": 1.0}
    variants = {
        "plain": {},
        "client": {"dp.level": "client", **dp},
        "sample": {"dp.level": "sample", **dp},
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sites = anchor_job.write_sites(args.data, args.seed, Path(tmp) / "anchor_sites.npz")
        if args.train_per_client:
            sites = keep_per_client(sites, args.train_per_client)
        for name in args.variants.split(","):
            config = {
                **anchor_job.fedkit_config(sites, args.seed, "local"),
                "rounds": args.rounds,
                "eval_every": args.rounds,
                "local_epochs": args.epochs,
                "checkpoint": True,
                **({"optimizer": "adam", "lr": 1e-3} if args.optimizer == "adam" else {}),
                **variants[name],
            }
            out = Path(tmp) / name
            results = run(config, out=out)
            attack = membership_auc(out)
            eps = results.final.get("privacy", {}).get("epsilon")
            rows.append((name, eps, results.final["global"]["acc"], attack))
            print(
                f"  {name}: epsilon {eps}, test acc {results.final['global']['acc']:.4f}, "
                f"AUC {attack['auc']:.3f}, losses {attack['member_loss']:.4f} / "
                f"{attack['non_member_loss']:.4f}",
                file=sys.stderr,
                flush=True,
            )
    print(
        f"loss-threshold membership inference, anchor job x {args.rounds} rounds x "
        f"{args.epochs} local epochs, seed {args.seed}; members: training samples, "
        "non-members: as many validation samples"
    )
    print(
        f"{'variant':8s} {'epsilon':>8s} {'test acc':>9s} {'AUC':>6s} {'loss in':>8s} {'loss out':>8s} {'n':>5s}"
    )
    for name, eps, acc, a in rows:
        print(
            f"{name:8s} {'inf' if eps is None else f'{eps:.2f}':>8s} {acc:9.4f} {a['auc']:6.3f} "
            f"{a['member_loss']:8.4f} {a['non_member_loss']:8.4f} {min(a['members'], a['non_members']):5d}"
        )


if __name__ == "__main__":
    main()
