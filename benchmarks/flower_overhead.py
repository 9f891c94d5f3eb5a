"""Flower engine overhead: the same job on the local engine, in Flower's simulation runtime
(thread and Ray backends) and through a loopback deployment (SuperLink + 3 SuperNodes).

Each variant runs in its own process tree. Printed per variant:

* seconds per round: the mean of the rounds' ``seconds`` in results.json after the first
  (training, aggregation and evaluation of one round, measured by the fedkit Server alike
  everywhere; start-up, e.g. Ray or the SuperNodes, and the first round's one-off imports are
  excluded) and its ratio to the local engine;
* total wall time of the command (start-up included);
* peak memory: the largest sum of resident set sizes (RSS, from /proc) over the whole
  process tree of the variant (driver, Ray's processes, SuperLink, SuperNodes and their
  ClientApp processes), sampled every 0.2 s.

Every variant runs with ``OMP_NUM_THREADS=1`` (unless set), as Ray's workers do.

The deployment runs twice: with fedkit's warm SuperNodes (the default: each message's
ClientApp process forked from a warm one, 0.1 s polls) and with ``--no-warm`` (Flower's own
fresh ``flwr-clientapp`` process per message and 0.5-3 s polls, fedkit's former behaviour).

    python benchmarks/flower_overhead.py [--rounds 3] [--plugin fca] [--skip-deploy]
        [--skip-simulation]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "flower" / "deploy_local.yaml"


def tree_rss(root: int) -> int:
    """Bytes resident in ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            statm = (entry / "statm").read_text().split()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        rss[int(entry.name)] = int(statm[1]) * page
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def measure(command: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and peak tree RSS of ``command``; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.2)
    output = proc.stdout.read().decode() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return time.perf_counter() - start, peak


def per_round(out: Path) -> float:
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    return statistics.mean(r["seconds"] for r in rounds[1:] or rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--skip-deploy", action="store_true")
    parser.add_argument("--skip-simulation", action="store_true", help="local and deployment only")
    args = parser.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    fedkit = [sys.executable, "-m", "fedkit_core.cli"]
    common = ["--config", str(JOB), "--rounds", str(args.rounds), "-q"]
    common += [flag for name in args.plugin for flag in ("--plugin", name)]
    variants = {
        "local": ["run", "--engine", "local"],
        "flower simulation (thread)": [
            "run",
            "--engine",
            "flower",
            "--set",
            "flower.backend=thread",
        ],
        "flower simulation (ray)": ["run", "--engine", "flower", "--set", "flower.backend=ray"],
    }
    if args.skip_simulation:
        variants = {"local": variants["local"]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, head) in enumerate(variants.items()):
            out = Path(tmp) / str(index)
            wall, peak = measure([*fedkit, *head, *common, "--out", str(out)], env)
            rows.append((name, per_round(out), wall, peak))
        if not args.skip_deploy:
            script = ROOT / "examples" / "flower" / "deploy_local.sh"
            extra = ["--rounds", str(args.rounds), "-q"]
            extra += [flag for name in args.plugin for flag in ("--plugin", name)]
            for mode, nodes in (("warm", ""), ("--no-warm", "--no-warm")):
                out = Path(tmp) / f"deploy{mode}"
                wall, peak = measure(
                    ["bash", str(script), str(out), *extra],
                    {**env, "PYTHON": sys.executable, "SUPERNODE_ARGS": nodes},
                )
                name = f"flower deployment ({mode}, 3 SuperNodes)"
                rows.append((name, per_round(out), wall, peak))
    base = rows[0][1]
    job = yaml.safe_load(JOB.read_text())
    print(
        f"job: {JOB.name} ({job['task']['sites']} clients), {args.rounds} rounds, plugins {args.plugin or ['fedavg']}"
    )
    print(f"{'engine':44} {'s/round':>8} {'ratio':>7} {'wall s':>8} {'peak MiB':>9}")
    for name, seconds, wall, peak in rows:
        print(f"{name:44} {seconds:8.2f} {seconds / base:7.2f} {wall:8.1f} {peak / 2**20:9.0f}")


if __name__ == "__main__":
    main()
