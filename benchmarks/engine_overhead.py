"""Engine overhead: fedkit's in-process engine against a bare PyTorch FedAvg loop.

Both do the same work on the same data: R rounds of one local epoch per client (same model,
optimiser, batch size, normalisation), FedAvg of the states, and one final evaluation of the
global model on every client's val and test split. The ratio engine / bare is the price of
hooks, messages, metrics and bookkeeping. Extra lines show the engine with evaluation every
round and with per-round checkpoints, which the bare loop does not do.

    python benchmarks/engine_overhead.py [--rounds 10] [--task synthetic] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from fedkit_core import run
from fedkit_core.federation import prepare
from fedkit_core.models import build_model
from fedkit_core.resolve import resolve_config


def bare_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """The optimiser the config names, built directly (what a plain script does)."""
    params, lr, wd = model.parameters(), cfg["lr"], cfg["weight_decay"]
    if cfg["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg["momentum"], weight_decay=wd)
    cls = torch.optim.Adam if cfg["optimizer"] == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=tuple(cfg["adam_betas"]), weight_decay=wd)


def bare_loop(config: dict) -> float:
    """Seconds for the same federation written as a plain PyTorch script."""
    cfg, plugins = resolve_config(config)
    fed = prepare(cfg, plugins)
    start = time.perf_counter()
    torch.manual_seed(0)
    global_model = build_model(fed.task, cfg["model"])
    models = {cid: build_model(fed.task, cfg["model"]) for cid in fed.clients}
    for _ in range(cfg["rounds"]):
        states, sizes = [], []
        for cid, data in fed.clients.items():
            model = models[cid]
            model.load_state_dict(global_model.state_dict())
            optimizer = bare_optimizer(model, cfg)
            model.train()
            train = data["train"]
            order = torch.randperm(len(train))
            for i in range(0, len(train), cfg["batch_size"]):
                idx = order[i : i + cfg["batch_size"]]
                if len(idx) < 2:
                    continue
                loss = F.cross_entropy(
                    model(data.normalizer(train.images[idx]))["logits"], train.targets[idx]
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            states.append(model.state_dict())
            sizes.append(len(train))
        total = sum(sizes)
        averaged = {}
        for key, value in states[0].items():
            mean = sum(s[key].float() * (n / total) for s, n in zip(states, sizes))
            averaged[key] = mean.to(value.dtype)
        global_model.load_state_dict(averaged)
    global_model.eval()
    with torch.inference_mode():
        for data in fed.clients.values():
            for split in ("val", "test"):
                part = data[split]
                for i in range(0, len(part), cfg["eval_batch_size"]):
                    F.softmax(global_model(data.normalizer(part.images[i : i + 256]))["logits"], 1)
    return time.perf_counter() - start


def engine(config: dict, out: str | None = None) -> float:
    """Seconds of fedkit's rounds (data preparation excluded, as in the bare loop)."""
    results = run(config, out=out)
    return sum(r["seconds"] for r in results.rounds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--task", default="synthetic")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = {"task": args.task, "rounds": args.rounds, "checkpoint": False, "seed": 0}
    runs = {
        "bare PyTorch loop": lambda: bare_loop({**base, "eval_every": args.rounds}),
        "fedkit, eval at the end": lambda: engine({**base, "eval_every": args.rounds}),
        "fedkit, eval every round": lambda: engine(base),
    }

    def with_checkpoints() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            return engine({**base, "checkpoint": True}, out=f"{tmp}/run")

    runs["fedkit, eval + checkpoint every round"] = with_checkpoints
    engine({**base, "rounds": 1})  # warm-up: imports, allocator
    times = {
        name: statistics.median(fn() for _ in range(args.repeats)) for name, fn in runs.items()
    }
    bare = times["bare PyTorch loop"]
    print(
        f"task={args.task} rounds={args.rounds} threads={torch.get_num_threads()} "
        f"(median of {args.repeats})"
    )
    print(f"{'variant':40s} {'s/round':>9s} {'ratio to bare':>14s}")
    for name, seconds in times.items():
        print(f"{name:40s} {seconds / args.rounds:9.3f} {seconds / bare:14.2f}")


if __name__ == "__main__":
    main()
