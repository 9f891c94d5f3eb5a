"""Synchronous rounds against FedBuff on a loopback Flower deployment with one slow node.

``examples/flower/deploy_local.sh`` starts a SuperLink and three SuperNodes on this machine
(TLS, node authentication) and submits its job; ``site2``'s node sleeps ``--slow`` seconds
before each fit (the ``test-faults`` plugin of ``tests/fault_plugin``, found on the Python
path as in the tests). Each mode runs ``--rounds`` rounds, evaluating only the last (an
evaluation waits for every node, the slow one included; see docs/hospitals.md), alternating
the modes ``--repeats`` times. Printed per run: the rounds' wall seconds (``seconds``
summed), the engine's wall seconds (``final.wall_seconds``: set-up, rounds and the final
evaluation), the updates applied per site, the final accuracy; then the median ratio of
each mode's rounds to sync's.

    python benchmarks/async_deployment.py [--rounds 4] [--slow 5] [--repeats 1]
        [--modes sync,fedbuff,fedasync]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def deploy(mode: str, args: argparse.Namespace, out: Path) -> dict:
    plugin = ROOT / "tests" / "fault_plugin"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(plugin), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = ["bash", str(ROOT / "examples" / "flower" / "deploy_local.sh"), str(out), "-q"]
    cmd += ["--plugin", "test-faults", "--set", f"test-faults.slow=[site2:{args.slow}]"]
    cmd += ["--rounds", str(args.rounds), "--set", f"eval_every={args.rounds}"]
    cmd += ["--set", f"aggregation={mode}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    results = json.loads((out / "results.json").read_text())
    rounds = results["rounds"]
    if mode in ("fedbuff", "fedasync"):
        per_site = Counter(u["client"] for r in rounds for u in r["updates"])
    else:
        per_site = Counter(c for r in rounds for c in r["train"])
    return {
        "rounds": sum(r["seconds"] for r in rounds),
        "wall": results["final"]["wall_seconds"],
        "updates": dict(sorted(per_site.items())),
        "acc": results["final"]["global"].get("acc"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--slow", type=float, default=5.0, help="seconds site2 sleeps per fit")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", default="sync,fedbuff")
    args = parser.parse_args()
    modes = args.modes.split(",")
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else "?"
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            for mode in modes:
                runs[mode].append(deploy(mode, args, Path(tmp) / f"{mode}-{k}"))
    print(
        f"loopback deployment, 3 SuperNodes, site2 sleeps {args.slow:g} s per fit, "
        f"{args.rounds} rounds (evaluated at the end), {args.repeats} repeat(s); "
        f"load average {' '.join(load)} before"
    )
    print(f"{'mode':>9s} {'rounds s':>9s} {'wall s':>8s} {'acc':>7s}  updates per site")
    for mode, rs in runs.items():
        for r in rs:
            acc = "-" if r["acc"] is None else f"{r['acc']:.4f}"
            print(f"{mode:>9s} {r['rounds']:9.1f} {r['wall']:8.1f} {acc:>7s}  {r['updates']}")
    for mode in modes[1:]:
        ratios = [m["rounds"] / s["rounds"] for m, s in zip(runs[mode], runs[modes[0]])]
        print(f"{mode} / {modes[0]}, rounds' wall time: median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
