"""Cost with the number of clients: the same data and the same sampled work split over 10,
100 and 1,000 clients, in fedkit and in a bare PyTorch loop doing the same work.

``fedkit``: ``fedkit_core.run`` of the synthetic task with ``partition.kind=iid``,
``sample_fraction=0.1`` (a tenth of the data trains each round, whatever N) and N clients,
in a fresh process. ``bare``: the floor of the same work written as a plain PyTorch loop in
a fresh process with the same torch threads (see :func:`bare_worker`): the same client
splits, network, optimiser and batches; the sampled clients train one after the other
on one model (each loads the global state, a fresh Adam, one epoch of batches of 32);
sample-weighted mean; then the global model scores every client's val and test samples in
batches of 256 running across clients, with pooled and per-client accuracy (one
``bincount``). What the bare loop does not do (per-client score sets of every metric,
records, plugin hooks, messages) is fedkit's own cost.

Printed per N and mode: setup (wall time before round 1), first round, steady round (median
of rounds 2..), peak PSS of the process tree, each as a ratio to the first N of the same mode
(targets for fedkit: 100 clients <= 1.3x, 1,000 clients <= 2x, memory <= 1.5x); then the
same times in process CPU seconds, the fairer measure on a machine shared with others; then
fedkit over bare per N; the split sizes per N (clients without val samples get one carved
from their training samples, so val grows and train shrinks with N); and ``/proc/loadavg``
before and after.

    python benchmarks/client_scaling.py [--clients 10,100,1000] [--rounds 3]
        [--head-samples 1500] [--repeats 1] [--threads 2] [--modes fedkit,bare]
        [--plugin NAME ...] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from anchor_job import ROOT, average, derive_seed, run_measured

SAMPLE_FRACTION, BATCH, EVAL_BATCH, LR = 0.1, 32, 256, 1e-3


def config(clients: int, rounds: int, head_samples: int, extra: dict | None = None) -> dict:
    """The run of ``clients`` clients; ``extra``: more config keys (``--plugin``, ``--set``)."""
    return {
        "task": {"name": "synthetic", "head_samples": head_samples},
        "clients": clients,
        "partition.kind": "iid",
        "sample_fraction": SAMPLE_FRACTION,
        "rounds": rounds,
        "checkpoint": False,
        "seed": 0,
        **(extra or {}),
    }


class CpuClock:
    """Process CPU seconds of set-up and of each round (a fair measure on a loaded machine,
    where wall times swing with the other processes)."""

    def __init__(self) -> None:
        self.last = time.process_time()
        self.setup = 0.0
        self.rounds: list[float] = []

    def on_start(self, total_rounds: int, first_round: int) -> None:
        self.setup, self.last = time.process_time() - self.last, time.process_time()

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None: ...

    def on_round_end(self, record: dict) -> None:
        now = time.process_time()
        self.rounds.append(now - self.last)
        self.last = now

    def on_end(self, results, run_dir) -> None: ...


def fedkit_worker(clients: int, rounds: int, head_samples: int, extra: dict) -> dict:
    from fedkit_core import run

    clock = CpuClock()
    results = run(config(clients, rounds, head_samples, extra), observer=clock)
    seconds = [r["seconds"] for r in results.rounds]
    setup = results["final"]["wall_seconds"] - sum(seconds)
    return {"rounds": seconds, "setup": setup, "cpu_setup": clock.setup, "cpu_rounds": clock.rounds}


def bare_worker(clients: int, rounds: int, head_samples: int, extra: dict) -> dict:
    """The same work as a plain PyTorch loop. It takes its data from fedkit's task loader
    and partitioner (so every client holds the same samples as in fedkit) and its network
    from fedkit's ``SmallCNN`` class (a plain ``nn.Module``) with a linear head; the rest is
    torch and numpy."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from fedkit_core.models.networks import SmallCNN
    from fedkit_core.partitions import partition
    from fedkit_core.resolve import resolve_config
    from fedkit_core.tasks.loading import load_task

    seed = 0
    start, cpu = time.perf_counter(), time.process_time()
    cfg, _ = resolve_config(config(clients, rounds, head_samples))
    data = load_task(cfg)
    split = partition(data, cfg)
    ids = list(split)
    norm = data.normalizer
    mean = torch.tensor(norm.mean).view(1, -1, 1, 1)
    std = torch.tensor(norm.std).view(1, -1, 1, 1)
    train = {cid: (split[cid]["train"].images, split[cid]["train"].targets) for cid in ids}
    held = {}  # val and test of every client, pooled, with each sample's client number
    for name in ("val", "test"):
        parts = [split[cid][name] for cid in ids]
        owner = np.repeat(np.arange(len(ids)), [len(s) for s in parts])
        held[name] = (
            torch.cat([s.images for s in parts]),
            torch.cat([s.targets for s in parts]),
            owner,
        )
    torch.manual_seed(derive_seed(seed, "model", "server"))
    backbone = SmallCNN(int(mean.shape[1]))
    model = torch.nn.Sequential(
        backbone, torch.nn.Linear(backbone.out_features, len(data.class_names))
    )
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    setup, cpu_setup = time.perf_counter() - start, time.process_time() - cpu
    k = max(1, round(SAMPLE_FRACTION * len(ids)))
    seconds, cpu_rounds, scores = [], [], {}
    for rnd in range(1, rounds + 1):
        start, cpu = time.perf_counter(), time.process_time()
        sampled = sorted(np.random.default_rng([seed, rnd]).choice(len(ids), k, replace=False))
        states, sizes = [], []
        model.train()
        for i in sampled:
            x_all, y_all = train[ids[i]]
            n = len(x_all)
            model.load_state_dict(global_state)
            torch.manual_seed(derive_seed(seed, rnd, ids[i]))
            rng = torch.Generator().manual_seed(derive_seed(seed, rnd, ids[i]))
            optimizer = torch.optim.Adam(model.parameters(), lr=LR)
            order = torch.randperm(n, generator=rng)
            for first in range(0, n, BATCH):
                idx = order[first : first + BATCH]
                if len(idx) == 1 and n > 1:  # batch norm cannot train on one sample
                    break
                x = (x_all[idx].float() / 255.0 - mean) / std
                loss = F.cross_entropy(model(x), y_all[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            states.append({key: v.detach().clone() for key, v in model.state_dict().items()})
            sizes.append(n)
        global_state = average(states, sizes)
        model.load_state_dict(global_state)
        model.eval()
        with torch.inference_mode():
            for name, (images, labels, owner) in held.items():
                probs = torch.cat(
                    [
                        F.softmax(
                            model((images[i : i + EVAL_BATCH].float() / 255.0 - mean) / std), 1
                        )
                        for i in range(0, len(images), EVAL_BATCH)
                    ]
                )
                hit = (probs.argmax(1) == labels).double().numpy()
                per_client = np.bincount(owner, hit, len(ids)) / np.maximum(
                    np.bincount(owner, minlength=len(ids)), 1
                )
                scores[name] = (float(hit.mean()), per_client)
        seconds.append(time.perf_counter() - start)
        cpu_rounds.append(time.process_time() - cpu)
    out = {"rounds": seconds, "setup": setup, "cpu_setup": cpu_setup, "cpu_rounds": cpu_rounds}
    return {**out, "test_acc": scores["test"][0]}


def split_sizes(clients: int, head_samples: int) -> dict[str, int]:
    """Samples per split over all clients, as fedkit partitions them for ``clients``."""
    from fedkit_core.partitions import partition
    from fedkit_core.resolve import resolve_config
    from fedkit_core.tasks.loading import load_task

    cfg, _ = resolve_config(config(clients, 1, head_samples))
    split = partition(load_task(cfg), cfg)
    return {s: sum(len(c[s]) for c in split.values()) for s in ("train", "val", "test")}


def measure(mode: str, clients: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, __file__, "--worker", mode, "--worker-clients", str(clients)]
        cmd += ["--report", str(report), "--rounds", str(args.rounds)]
        cmd += ["--head-samples", str(args.head_samples), "--threads", str(args.threads)]
        cmd += [f"--plugin={p}" for p in args.plugin] + [f"--set={s}" for s in args.set]
        env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}", "OMP_NUM_THREADS": str(args.threads)}
        _, peak, error = run_measured(cmd, {**os.environ, **env})
        if error is not None:
            raise SystemExit(f"{mode} with {clients} clients failed:\n{error}")
        out = json.loads(report.read_text())
    return {
        "setup": out["setup"],
        "first": out["rounds"][0],
        "round": statistics.median(out["rounds"][1:]),
        "pss": peak / 2**20,
        "cpu setup": out["cpu_setup"],
        "cpu first": out["cpu_rounds"][0],
        "cpu round": statistics.median(out["cpu_rounds"][1:]),
    }


COLUMNS = {
    "setup": "setup s",
    "first": "1st round s",
    "round": "round s",
    "pss": "PSS MiB",
    "cpu setup": "CPU setup s",
    "cpu first": "CPU 1st s",
    "cpu round": "CPU round s",
}


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", default="10,100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--head-samples", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (1 on a machine shared with others)"
    )
    parser.add_argument("--modes", default="fedkit,bare", help="fedkit, bare or both")
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        help="a method plugin of the fedkit runs (repeatable; the bare loop has none)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key of the fedkit runs (repeatable; a YAML value)",
    )
    parser.add_argument("--worker", choices=("fedkit", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--worker-clients", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        work = fedkit_worker if args.worker == "fedkit" else bare_worker
        extra = {"plugins": args.plugin} if args.plugin else {}
        for item in args.set:
            key, _, value = item.partition("=")
            extra[key] = yaml.safe_load(value)
        args.report.write_text(
            json.dumps(work(args.worker_clients, args.rounds, args.head_samples, extra))
        )
        return
    counts = [int(c) for c in args.clients.split(",")]
    modes = [m for m in ("fedkit", "bare") if m in args.modes.split(",")]
    before = loadavg()
    runs: dict[tuple[str, int], list[dict]] = {(m, n): [] for m in modes for n in counts}
    for _ in range(args.repeats):
        for n in counts:  # alternating
            for mode in modes:
                runs[mode, n].append(measure(mode, n, args))
    med = {key: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for key, rs in runs.items()}
    print(
        f"synthetic, head_samples={args.head_samples}, iid, sample_fraction={SAMPLE_FRACTION}, "
        f"{args.rounds} rounds, {args.threads} threads, medians of {args.repeats}; "
        f"plugins {','.join(args.plugin) or 'none'}, set {' '.join(args.set) or 'nothing'}; "
        f"ratios to {counts[0]} clients of the same mode; load average {before} before, "
        f"{loadavg()} after"
    )
    for keys in (list(COLUMNS)[:4], list(COLUMNS)[4:]):
        print(f"{'clients':>8s} {'mode':>6s} " + " ".join(f"{COLUMNS[k]:>16s}" for k in keys))
        for mode in modes:
            base = med[mode, counts[0]]
            for n in counts:
                m = med[mode, n]
                cells = [f"{m[k]:7.2f} ({m[k] / base[k]:4.2f}x)" for k in keys]
                print(f"{n:8d} {mode:>6s} " + " ".join(f"{c:>16s}" for c in cells))
    if len(modes) == 2:
        print("fedkit / bare:")
        print(f"{'clients':>8s} " + " ".join(f"{COLUMNS[k]:>12s}" for k in COLUMNS))
        for n in counts:
            ratios = [med["fedkit", n][k] / med["bare", n][k] for k in COLUMNS]
            print(f"{n:8d} " + " ".join(f"{r:11.2f}x" for r in ratios))
    sizes = {n: split_sizes(n, args.head_samples) for n in counts}
    print(
        "samples over all clients: "
        + "; ".join(
            f"{n} clients: " + ", ".join(f"{s} {c}" for s, c in sz.items())
            for n, sz in sizes.items()
        )
    )


if __name__ == "__main__":
    main()
