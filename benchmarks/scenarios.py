"""The failure scenarios of examples/sites/ in each aggregation mode: what survives, how long.

Runs every scenario file (``vpn-drop``, ``straggler``, ``late-joiner``) in each mode on one
task (default: the built-in synthetic task, 4 sites) in this process, one after the other,
and prints per run: whether it completed every round, its simulated time, the final
balanced accuracy, the updates of each site that were applied (sync and deadline: rounds
whose training included it; fedbuff, fedasync: updates), the seconds of work outages held
up, and the events (late or failed updates). ``--base`` overrides the files'
``base.samples_per_second`` (their times fit a MedMNIST round of about 3 s: on the
synthetic task ``--base 150`` gives rounds of that length).

    python benchmarks/scenarios.py [--rounds 12] [--modes sync,deadline,fedbuff]
        [--deadline 4] [--base 150] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("vpn-drop", "straggler", "late-joiner")


def one(scenario: str, mode: str, args: argparse.Namespace, extra: dict) -> dict:
    from fedkit_core import run
    from fedkit_core.sites import load_sites

    sites = load_sites(str(ROOT / "examples" / "sites" / f"{scenario}.yaml"))
    if args.base is not None:
        sites["base"] = {"samples_per_second": args.base}
    config = {"rounds": args.rounds, "checkpoint": False, "sites": sites, "aggregation": mode}
    if mode == "deadline":
        config["deadline"] = args.deadline
    results = run({**config, **extra})
    rounds = results["rounds"]
    if mode in ("fedbuff", "fedasync"):
        applied = Counter(u["client"] for r in rounds for u in r["updates"])
    else:
        applied = Counter(c for r in rounds for c in r["train"])
    return {
        "complete": results["status"] == "complete" and len(rounds) == args.rounds,
        "simulated": results["final"]["simulated_seconds"],
        "bacc": results["final"]["global"]["bacc"],
        "applied": dict(sorted(applied.items())),
        "waited": sum(o["waited"] for r in rounds for o in r.get("outages", [])),
        "events": len(results["events"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--modes", default="sync,deadline,fedbuff")
    parser.add_argument("--deadline", type=float, default=4.0)
    parser.add_argument("--base", type=float, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        extra[key] = yaml.safe_load(value)
    print(
        f"{args.rounds} rounds, deadline {args.deadline:g} s, base "
        f"{args.base or 'of the files'}, set {' '.join(args.set) or 'nothing'}"
    )
    print(
        f"{'scenario':>12s} {'mode':>9s} {'complete':>8s} {'sim s':>8s} {'bACC':>6s} "
        f"{'waited s':>9s} {'events':>6s}  updates applied per site"
    )
    for scenario in SCENARIOS:
        for mode in args.modes.split(","):
            r = one(scenario, mode, args, extra)
            print(
                f"{scenario:>12s} {mode:>9s} {str(r['complete']):>8s} {r['simulated']:8.1f} "
                f"{r['bacc']:6.3f} {r['waited']:9.1f} {r['events']:6d}  {r['applied']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
