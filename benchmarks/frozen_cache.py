"""What the frozen-trunk cache (``freeze_cache``) buys: FedAvg on Fed-ISIC2019 (the five
offline centres as clients, FLamby's split) at 64 px with the offline ImageNet
EfficientNet-Lite0, the stem and stages 0-4 frozen (``--stages 5``); each mode in a fresh
process, the modes alternating ``--repeats`` times (a shared machine's load drifts).

    OMP_NUM_THREADS=1 python benchmarks/frozen_cache.py            # a few minutes
    OMP_NUM_THREADS=1 python benchmarks/frozen_cache.py --stages 6  # stages 0-5 frozen
    OMP_NUM_THREADS=1 python benchmarks/frozen_cache.py --per-centre 0 --rounds 2 \
        --repeats 1 --no-exactness                                 # all images

``--per-centre N`` keeps the first N training and N // 4 test images of each centre (a
folder of symlinks and a shortened split file; 0: the whole data set). Printed per mode
(``off``: the trunk recomputed every batch; ``memory``: the cache, float32): the steady
round (median of rounds 2..R over the repeats: training and the evaluation of the previous
round's model), the first round (with the cache: its computation too), the largest peak RSS
of its processes; then the speed-up of the steady round and the most the cache can buy by
the network's FLOPs (:func:`flop_bound`). The exactness check then runs one round of each
mode plus the cache in float16
in this process and prints the difference of the global model to the uncached run's
(``||w - w_off|| / ||w_off||`` over its float entries) and the bACC of each.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "fed_isic2019"
STEM = ["backbone.net.conv_stem", "backbone.net.bn1"]

CHILD = """
import json, resource, sys, time
from fedkit_core import run
from fedkit_core.contract.observer import Observer

class Clock(Observer):
    def on_start(self, total_rounds, first_round):
        self.ends = [time.perf_counter()]
    def on_round_end(self, record):
        self.ends.append(time.perf_counter())

clock = Clock()
results = run(json.loads(sys.argv[1]), observer=clock)
rounds = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"rounds": rounds, "peak_mib": peak, "bacc": results.final["global"]["bacc"]}))
"""


def subset(source: Path, per_centre: int, out: Path) -> Path:
    """A Fed-ISIC2019 folder with the first ``per_centre`` training and ``per_centre // 4``
    test rows of each centre in the split file, its images a symlink to ``source``'s."""
    with open(source / "train_test_split", newline="") as fh:
        rows = list(csv.DictReader(fh))
    kept, seen = [], {}
    for row in rows:
        key = (row["center"], row["fold"])
        limit = per_centre if row["fold"] == "train" else max(1, per_centre // 4)
        if seen.get(key, 0) < limit:
            seen[key] = seen.get(key, 0) + 1
            kept.append(row)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train_test_split", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(kept)
    link = out / "ISIC_2019_Training_Input_preprocessed"
    if not link.exists():
        link.symlink_to((source / link.name).resolve())
    return out


def config(data: Path, args: argparse.Namespace, **overrides) -> dict:
    """FedAvg on the centres, as the results page's pretrained runs (Adam 1e-3, batch 32)."""
    return {
        "task": {"name": "isic2019", "path": str(data), "image_size": args.image_size},
        "model": "efficientnet_lite0",
        "pretrained": True,
        "freeze": STEM + [f"backbone.net.blocks.{k}" for k in range(args.stages)],
        "rounds": args.rounds,
        "local_epochs": 1,
        "batch_size": 32,
        "optimizer": "adam",
        "lr": 1e-3,
        "checkpoint": False,
        "figure_formats": [],
        **overrides,
    }


def measure(data: Path, args: argparse.Namespace, mode: str) -> dict:
    cfg = config(data, args, freeze_cache=mode)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=False,
    )
    if out.returncode:
        sys.exit(f"{mode}: the run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def exactness(data: Path, args: argparse.Namespace, folder: Path) -> None:
    from fedkit_core import run
    from fedkit_core.engines.checkpoint import ServerCheckpoints

    modes = {
        "off": {"freeze_cache": "off"},
        "memory, float32": {"freeze_cache": "memory", "freeze_cache_dtype": "float32"},
        "memory, float16": {"freeze_cache": "memory", "freeze_cache_dtype": "float16"},
    }
    states, baccs = {}, {}
    for name, setting in modes.items():
        cfg = config(data, args, rounds=1, checkpoint=True, **setting)
        baccs[name] = run(cfg, out=folder / name.replace(", ", "-")).final["global"]["bacc"]
        states[name] = ServerCheckpoints(folder / name.replace(", ", "-") / "checkpoint").load()[
            "global_state"
        ]
    print("exactness, one round: the global model's difference to the uncached run's,")
    print("||w - w_off|| / ||w_off|| over its float entries, and the bACC")
    base = states["off"]
    keys = [k for k in base if base[k].is_floating_point()]
    norm = sum(float(base[k].double().pow(2).sum()) for k in keys) ** 0.5
    for name, state in states.items():
        gap = sum(float((state[k] - base[k]).double().pow(2).sum()) for k in keys) ** 0.5
        print(f"  {name:18s} {gap / norm:.2e}   bACC {baccs[name]:.4f}")


def flop_bound(args: argparse.Namespace) -> str:
    """What the cache can buy at most, from the network's forward FLOPs per image (torch's
    flop counter, eval mode): an uncached training step runs the frozen trunk forward and the
    rest forward and backward (about twice its forward), a cached step the rest alone."""
    import timm
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    net = timm.create_model("tf_efficientnet_lite0", num_classes=8).eval()
    x = torch.zeros(1, 3, args.image_size, args.image_size)

    def flops(step: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            out = step()
        return counter.get_total_flops() / 1e6, out

    trunk, h = flops(lambda: _trunk(net, x, args.stages))
    rest, _ = flops(lambda: net.forward_head(net.bn2(net.conv_head(_stages(net, h, args.stages)))))
    step = trunk + 3 * rest
    return (
        f"FLOP bound: per image the frozen trunk's forward is {trunk:.1f} MFLOP, the rest's "
        f"{rest:.1f} (a training step about 3x that: forward and backward); an uncached step "
        f"about {step:.0f} MFLOP, a cached one {3 * rest:.0f}: the cache makes a training step "
        f"at most {step / (3 * rest):.2f}x faster, an evaluation {(trunk + rest) / rest:.2f}x"
    )


def _trunk(net: Any, x: Any, stages: int) -> Any:
    x = net.bn1(net.conv_stem(x))
    for block in net.blocks[:stages]:
        x = block(x)
    return x


def _stages(net: Any, x: Any, first: int) -> Any:
    for block in net.blocks[first:]:
        x = block(x)
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--per-centre", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--stages", type=int, default=5, help="frozen stages after the stem")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-exactness", action="store_true")
    args = parser.parse_args()
    if not (args.data / "train_test_split").is_file():
        sys.exit(f"no Fed-ISIC2019 at {args.data} (see ../shared/data/README.md)")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the steady round leaves out the first)")
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data if args.per_centre == 0 else subset(args.data, args.per_centre, Path(tmp))
        size = "all images" if args.per_centre == 0 else f"{args.per_centre} per centre"
        print(
            f"Fed-ISIC2019 ({size}), {args.image_size} px, efficientnet_lite0 pretrained, "
            f"stem + stages 0-{args.stages - 1} frozen, FedAvg, {args.rounds} rounds, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
        )
        print(f"{'mode':8s} {'steady round s':>15s} {'first round s':>14s} {'peak RSS MiB':>13s}")
        found: dict[str, list[dict]] = {"off": [], "memory": []}
        for _ in range(args.repeats):
            for mode in found:
                found[mode].append(measure(data, args, mode))
        steady = {}
        for mode, runs in found.items():
            steady[mode] = statistics.median(t for m in runs for t in m["rounds"][1:])
            first = statistics.median(m["rounds"][0] for m in runs)
            peak = max(m["peak_mib"] for m in runs)
            print(f"{mode:8s} {steady[mode]:15.2f} {first:14.2f} {peak:13.0f}")
        print(
            f"speed-up of the steady round with the cache: {steady['off'] / steady['memory']:.2f}x"
        )
        print(flop_bound(args))
        if not args.no_exactness:
            exactness(data, args, Path(tmp) / "runs")


if __name__ == "__main__":
    main()
