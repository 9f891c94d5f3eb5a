"""Flower engine overhead: the same job on the local engine, in Flower's simulation runtime
(Flower's Ray backend, the public path; the fast layer's thread backend) and through a
loopback deployment (SuperLink + 3 SuperNodes).

Each variant runs in its own process tree; the variants alternate, ``--repeats`` times (a
load that changes over time hits every variant alike). Printed per variant:

* seconds per round: the median of the rounds' ``seconds`` in results.json after the first,
  over all repeats (training, aggregation and evaluation of one round, measured by the
  fedkit Server alike everywhere; start-up, e.g. Ray or the SuperNodes, and the first
  round's one-off imports are excluded) and its ratio to the local engine's; and their mean
  (a deployed run's last round also evaluates on its own, see ``eval_with_fit``);
* total wall time of the command (start-up included; median over the repeats);
* peak memory: the largest sum of resident set sizes (RSS, from /proc) over the whole
  process tree of the variant (driver, Ray's processes, SuperLink, SuperNodes and their
  ClientApp processes), sampled every 0.2 s;
* the final global accuracy (the same job must give the same model everywhere);
* the load average (1 min) before and after the variant's runs, since other jobs on the
  machine stretch every figure.

Every variant runs with ``OMP_NUM_THREADS=1`` (unless set), as Ray's workers do.

The deployment runs with the fast layer (``fedkit flower supernode --warm`` and
``flower.fast=true``: fedkit's warm SuperNodes and the ServerApp's sooner object pulls), and
on the public path too when asked (``--plain``: Flower's own ``flower-supernode``, a fresh
``flwr-clientapp`` process per message, 0.5-3 s polls). ``--baseline DIR`` also runs the
deployment of another fedkit checkout (e.g. ``git worktree add --detach DIR main``; with its
own defaults), alternating with this one's, to measure a change before and after in one
command under the same load.

``--set KEY=VALUE`` (repeatable) sets a config key in every variant (e.g.
``eval_with_fit=off``).

    python benchmarks/flower_overhead.py [--rounds 3] [--repeats 2] [--plugin fca]
        [--skip-deploy] [--skip-simulation] [--plain] [--baseline DIR] [--set KEY=VALUE]
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


def measure(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int]:
    """Wall seconds and peak tree RSS of ``command`` run in ``cwd``; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.2)
    output = proc.stdout.read().decode() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return time.perf_counter() - start, peak


def steady_rounds(out: Path) -> list[float]:
    """The ``seconds`` of every round after the first (all rounds if there is one)."""
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    return [r["seconds"] for r in rounds[1:] or rounds]


def final_accuracy(out: Path) -> float:
    return float(json.loads((out / "results.json").read_text())["final"]["global"]["acc"])


def checkout_env(root: Path) -> dict[str, str]:
    """The environment that runs the fedkit checkout at ``root``: it and its plugins first
    on the path (ahead of an installed fedkit), one torch thread unless set."""
    plugins = [str(p.parent) for p in sorted(root.glob("plugins/*/pyproject.toml"))]
    plugins += [str(p.parent) for p in sorted(root.glob("examples/plugin-*/pyproject.toml"))]
    path = [str(root), *plugins, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--skip-deploy", action="store_true")
    parser.add_argument("--skip-simulation", action="store_true", help="no simulation runs")
    parser.add_argument(
        "--plain", action="store_true", help="also deploy on the public path (no fast layer)"
    )
    parser.add_argument(
        "--baseline", type=Path, help="also deploy with the fedkit checkout in this folder"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    env = checkout_env(ROOT)
    fedkit = [sys.executable, "-m", "fedkit_core.cli"]
    common = ["--config", str(JOB), "--rounds", str(args.rounds), "-q"]
    common += [flag for name in args.plugin for flag in ("--plugin", name)]
    common += [flag for pair in args.set for flag in ("--set", pair)]
    script = ["bash", str(ROOT / "examples" / "flower" / "deploy_local.sh")]
    extra = ["--rounds", str(args.rounds), "-q"]
    extra += [flag for name in args.plugin for flag in ("--plugin", name)]
    extra += [flag for pair in args.set for flag in ("--set", pair)]
    deploy_env = {**env, "PYTHON": sys.executable}
    # name -> (command before the output folder, command after it, environment, folder)
    variants: dict[str, tuple[list[str], list[str], dict[str, str], Path]] = {
        "local": ([*fedkit, "run", "--engine", "local", *common, "--out"], [], env, ROOT),
    }
    if not args.skip_simulation:
        for backend, label in (("ray", "public: ray"), ("thread", "fast: thread")):
            head = [*fedkit, "run", "--engine", "flower", "--set", f"flower.backend={backend}"]
            variants[f"flower simulation ({label})"] = ([*head, *common, "--out"], [], env, ROOT)
    if not args.skip_deploy:
        if args.baseline is not None:
            base_root = args.baseline.resolve()
            variants["baseline deployment (warm, 3 SuperNodes)"] = (
                ["bash", str(base_root / "examples" / "flower" / "deploy_local.sh")],
                extra,
                {**checkout_env(base_root), "PYTHON": sys.executable, "SUPERNODE_ARGS": ""},
                base_root,
            )
        variants["flower deployment (fast: warm, 3 SuperNodes)"] = (
            script,
            [*extra, "--set", "flower.fast=true"],
            {**deploy_env, "SUPERNODE_ARGS": "--warm"},
            ROOT,
        )
        if args.plain:
            variants["flower deployment (public, 3 SuperNodes)"] = (
                script,
                extra,
                {**deploy_env, "SUPERNODE_ARGS": "--no-warm"},
                ROOT,
            )
    runs: dict[str, list[tuple[list[float], float, int, float, float, float]]] = {
        name: [] for name in variants
    }
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for index, (name, (head, tail, variant_env, cwd)) in enumerate(variants.items()):
                out = Path(tmp) / f"{repeat}-{index}"
                before = load()
                wall, peak = measure([*head, str(out), *tail], variant_env, cwd)
                runs[name].append(
                    (steady_rounds(out), wall, peak, final_accuracy(out), before, load())
                )
    base = statistics.median(s for r in runs["local"] for s in r[0])
    job = yaml.safe_load(JOB.read_text())
    print(
        f"job: {JOB.name} ({job['task']['sites']} clients), {args.rounds} rounds, "
        f"plugins {args.plugin or ['fedavg']}, {args.repeats} repeats alternating"
        + "".join(f", {pair}" for pair in args.set)
    )
    print(
        f"{'engine':44} {'s/round':>8} {'ratio':>7} {'mean':>6} {'ratio':>6} {'wall s':>7} "
        f"{'peak MiB':>9} {'final acc':>9}  load avg"
    )
    base_mean = statistics.fmean(s for r in runs["local"] for s in r[0])
    for name, done in runs.items():
        seconds = statistics.median(s for r in done for s in r[0])
        mean = statistics.fmean(s for r in done for s in r[0])
        wall = statistics.median(r[1] for r in done)
        peak = max(r[2] for r in done)
        accuracy = ",".join(sorted({f"{r[3]:.4f}" for r in done}))
        loads = [x for r in done for x in r[4:]]
        print(
            f"{name:44} {seconds:8.2f} {seconds / base:7.2f} {mean:6.2f} {mean / base_mean:6.2f} "
            f"{wall:7.1f} {peak / 2**20:9.0f} {accuracy:>9}  {min(loads):.1f}-{max(loads):.1f}"
        )


if __name__ == "__main__":
    main()
