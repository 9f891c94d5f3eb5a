"""The anchor job: one small federation run identically as a bare PyTorch loop, on fedkit's
local engine, on fedkit's Flower simulation engine and as a raw Flower simulation.

The job: PneumoniaMNIST's train split (``../shared/data/medmnist/pneumoniamnist.npz``, 4708
images) scaled to [-1, 1], IID into 10 clients (``np.random.default_rng(seed).permutation``
and ``np.array_split``, each client's indices sorted); a CNN (conv 1->32, conv 32->64, 3x3,
ReLU and 2x2 max-pool each, linear 3136->128->2: 421k parameters); each round every client
loads the global weights and runs one epoch of SGD (lr 0.05, momentum 0.9, a fresh optimiser
each round, batch 64, shuffled by a per-client per-round ``torch.Generator``); the
sample-weighted mean of the states; 5 rounds; torch threads 2; test accuracy at the end.
Every mode seeds as fedkit does (model from ``derive_seed(seed, "model", "server")``,
shuffles from ``derive_seed(seed, round, client)``), so all reach the same accuracy.

Modes (each a fresh process, run in alternation, ``--repeats`` times; medians printed):

* ``bare``: a plain PyTorch loop (no fedkit import);
* ``fedkit-local``: ``fedkit_core.run`` on the local engine (task ``npz`` of a file holding the
  same split as sites; ``task.mean=task.std=0.5``);
* ``fedkit-run``: the same config as ``fedkit run --config job.yaml --out DIR --quiet``
  types it (the CLI in this process): the whole command, its run folder included
  (results.json, metrics.csv, the figures);
* ``fedkit-flower``: the same config with ``engine=flower`` (Ray backend, 2 CPUs per client);
* ``flower-raw``: a ServerApp and ClientApp written directly on Flower's Message API,
  run by ``flwr.simulation.run_simulation`` (Ray backend, 2 CPUs per client).

Printed per mode: process wall time (start to exit of the process), steady round (median of
rounds 2 to 4 as each mode times them: the first round pays the warm-up, and fedkit's last
round holds its end-of-run evaluation, which the bare loop and raw Flower do after their
timed rounds), the seconds outside the timed rounds (wall less the sum of the mode's
rounds: start-up, imports, data, set-up and what the process does after its rounds, such
as fedkit's run folder and figures), peak PSS of the process tree (sum over the process and
all its descendants, from ``/proc/*/smaps_rollup``, sampled every ``PSS_EVERY`` s), test
accuracy, and the ratios to the bare loop (fedkit-flower also to flower-raw). Then, for
fedkit-local and fedkit-run against bare and fedkit-flower against flower-raw, the paired
ratios: each repeat runs both modes back to back, so their per-repeat ratio of wall and of
steady round removes the drift the two share; printed as the geometric mean over repeats
with its 95% confidence interval (paired t on the log ratios, see :func:`paired_ratio`). On
a machine whose round times swing by tens of percent from run to run, a target ratio is met
only when the interval lies below it.

fedkit sets glibc's malloc thresholds in every process that trains clients
(:mod:`fedkit_core.allocator`); the bare loop and raw Flower keep glibc's defaults, under
which a process may map and page-fault a training step's memory afresh every step (a raw
Flower worker sometimes did: 0.21 s a client instead of 0.16 s). ``--same-malloc`` sets the
thresholds for every mode, through the environment, to compare the rest of the work alone.

**The pretrained EfficientNet-Lite0 job** (``--model efficientnet_lite0``, bare and
fedkit-local modes): the same federation with fedkit's ``model=efficientnet_lite0
pretrained=true`` (the offline ImageNet weights, ``fedkit[pretrained]``), the 28 px images
resized to ``--image-size`` (64) as ``task.image_size`` resizes them, scaled to [-1, 1] (the
network's own input scaling) and repeated on three channels; SGD at ``--lr`` (0.01). The bare
loop builds the same timm network (``tf_efficientnet_lite0``, weights converted by fedkit in
the parent process and handed over as a timm state dict) and a linear head, seeded alike, and
repeats its images on three channels once, up front. ``--train-samples N`` keeps N training
images (the first N of the seeded permutation, then split into ``--clients``), ``--rounds``
sets the rounds, ``--freeze conv_stem,bn1,blocks.0`` freezes those parts of the network in
both loops (fedkit: ``freeze=[backbone.net.conv_stem, ...]``; not trained, in eval mode).

    python benchmarks/anchor_job.py [--repeats 3] [--modes bare,fedkit-local,...] [--same-malloc]
    python benchmarks/anchor_job.py --model efficientnet_lite0 --image-size 64 \
        --train-samples 512 --clients 4 --rounds 4 --modes bare,fedkit-local [--freeze ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "medmnist" / "pneumoniamnist.npz"
MODES = ("bare", "fedkit-local", "fedkit-run", "fedkit-flower", "flower-raw")
CLIENTS, ROUNDS, BATCH, LR, MOMENTUM, THREADS = 10, 5, 64, 0.05, 0.9, 2
RAW_CACHE: dict = {}  # a raw Flower worker's data and model, loaded at its first message
LITE = "efficientnet_lite0"


@dataclass
class Job:
    """What is trained: the anchor CNN at 28 px (the defaults) or ``efficientnet_lite0``
    (pretrained; see the module docstring). ``weights``: the pretrained network's state
    (timm names) the parent process wrote for the bare loop."""

    model: str = "cnn"
    image_size: int | None = None
    clients: int = CLIENTS
    rounds: int = ROUNDS
    train_samples: int | None = None
    lr: float = LR
    freeze: tuple[str, ...] = ()
    weights: str | None = None


JOB = Job()  # this process's job: set by main() and, in a worker, from --job


# ---------------------------------------------------------------------------- the job


def derive_seed(*parts: object) -> int:
    """fedkit's seed derivation (``fedkit_core.hooks.context.derive_seed``), restated so
    the bare loop and raw Flower import nothing of fedkit."""
    words = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return int(np.random.SeedSequence([abs(int(w)) for w in words]).generate_state(1)[0] >> 1)


def client_ids() -> list[str]:
    return [f"c{k:02d}" for k in range(JOB.clients)]


def split_indices(n: int, seed: int) -> list[np.ndarray]:
    """The IID split of ``n`` training samples (of the job's first ``train_samples`` of the
    permutation, when set): one sorted index array per client."""
    order = np.random.default_rng(seed).permutation(n)[: JOB.train_samples]
    return [np.sort(p) for p in np.array_split(order, JOB.clients)]


def pretrained_model(num_classes: int):
    """The bare loop's pretrained model: timm's network (its ImageNet weights from
    ``JOB.weights``) and a linear head, built in the order fedkit builds them (so a seed
    gives the same head); its frozen parts (``JOB.freeze``) without gradients and in eval
    mode, as fedkit's ``freeze`` keeps them."""
    import timm
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = timm.create_model("tf_efficientnet_lite0", num_classes=0)
            if JOB.weights:
                state = torch.load(JOB.weights, map_location="cpu", weights_only=True)
                self.backbone.load_state_dict(state)
            self.head = nn.Linear(self.backbone.num_features, num_classes)
            for name, param in self.backbone.named_parameters():
                if _under(name, JOB.freeze):
                    param.requires_grad_(False)

        def forward(self, x):
            return self.head(self.backbone(x))

        def train(self, mode: bool = True):
            super().train(mode)
            for name, module in self.backbone.named_modules():
                if mode and _under(name, JOB.freeze):
                    module.train(False)
            return self

    return Net()


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def make(num_classes: int = 2, in_channels: int = 1):
    """The anchor CNN (also fedkit's ``model=anchor_job:make``), or the job's pretrained
    EfficientNet-Lite0 with a linear head."""
    from torch import nn

    if JOB.model == LITE:
        return pretrained_model(num_classes)

    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(3136, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def scaled(images: np.ndarray):
    """uint8 (N, 28, 28) -> float (N, 1, 28, 28) in [-1, 1], computed as fedkit's normaliser
    with mean = std = 0.5 computes it (so the floats are bitwise the same). The job's
    ``image_size`` resizes first, as fedkit's ``task.image_size`` does (bilinear,
    antialiased, rounded back to uint8); the pretrained job's images are repeated on three
    channels."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(images[:, None])
    if JOB.image_size and JOB.image_size != x.shape[-1]:
        parts = []
        for part in x.split(512):  # fedkit_core.tasks.loading._resize_images, restated
            part = F.interpolate(
                part.float(),
                size=(JOB.image_size,) * 2,
                mode="bilinear",
                antialias=True,
                align_corners=False,
            )
            parts.append(part.round().clamp(0, 255).to(torch.uint8))
        x = torch.cat(parts)
    x = (x.float() / 255.0 - 0.5) / 0.5
    return x.repeat(1, 3, 1, 1) if JOB.model == LITE else x


def client_data(path: Path, seed: int) -> dict[str, tuple]:
    """Each client's training images (scaled) and labels."""
    import torch

    with np.load(path) as npz:
        images, labels = npz["train_images"], npz["train_labels"].reshape(-1)
    parts = split_indices(len(images), seed)
    return {
        cid: (scaled(images[idx]), torch.from_numpy(labels[idx].astype(np.int64)))
        for cid, idx in zip(client_ids(), parts)
    }


def train_client(
    model, x, y, seed: int, rnd: int, cid: str, precision: str = "fp32", channels_last: bool = False
) -> None:
    """One local epoch of SGD with a fresh optimiser, shuffled as a fedkit client shuffles.
    ``bf16``: forward passes under autocast to bfloat16, the loss on float32 logits;
    ``channels_last``: batches in that layout (benchmarks/gpu_job.py's variants)."""
    import torch
    import torch.nn.functional as F

    rng = torch.Generator().manual_seed(derive_seed(seed, rnd, cid))
    torch.manual_seed(derive_seed(seed, rnd, cid))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=JOB.lr, momentum=MOMENTUM)
    model.train()
    n = len(x)
    # the order on the data's device once (a host index into device data waits for the GPU)
    order = torch.randperm(n, generator=rng).to(x.device)
    for start in range(0, n, BATCH):
        idx = order[start : start + BATCH]
        if len(idx) == 1 and n > 1:
            break
        batch = x[idx]
        if channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        if precision == "bf16":
            with torch.autocast(batch.device.type, dtype=torch.bfloat16):
                logits = model(batch)
            logits = logits.float()
        else:
            logits = model(batch)
        loss = F.cross_entropy(logits, y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def average(states: list[dict], sizes: list[int]) -> dict:
    """The sample-weighted mean, accumulated as fedkit's FedAvg does (float32, in order;
    an entry equal in every state comes back as it is)."""
    import torch

    total = float(sum(sizes))
    out = {}
    for key, first in states[0].items():
        if all(torch.equal(state[key], first) for state in states[1:]):
            out[key] = first.clone()
            continue
        acc = torch.zeros(first.shape, dtype=torch.float32)
        for state, n in zip(states, sizes):
            acc.add_(state[key].float(), alpha=float(n) / total)
        out[key] = acc.to(first.dtype)
    return out


def test_accuracy(model, path: Path, device: str = "cpu") -> float:
    """Accuracy on the test split, computed on ``device`` (where ``model`` is)."""
    import torch

    with np.load(path) as npz:
        x, y = scaled(npz["test_images"]), torch.from_numpy(npz["test_labels"].reshape(-1))
    model.eval()
    with torch.inference_mode():
        batches = (x[i : i + 256].to(device) for i in range(0, len(x), 256))
        pred = torch.cat([model(b).argmax(1).cpu() for b in batches])
    return float((pred == y).double().mean())


def initial_model(seed: int):
    import torch

    torch.manual_seed(derive_seed(seed, "model", "server"))
    return make()


# ---------------------------------------------------------------------------- the modes


def run_bare(path: Path, seed: int) -> dict:
    import torch

    torch.set_num_threads(THREADS)
    global_model = initial_model(seed)
    rounds = bare_rounds(global_model, make(), client_data(path, seed), JOB.rounds, seed)
    return {"rounds": rounds, "accuracy": test_accuracy(global_model, path)}


def bare_rounds(global_model, local, data: dict, rounds: int, seed: int, **train) -> list[float]:
    """FedAvg rounds of the bare loop: each client (``data``: id -> (x, y)) loads the global
    weights into ``local`` and trains (:func:`train_client` with ``train``'s extra
    arguments); the sample-weighted mean becomes ``global_model``'s. The rounds' seconds."""
    import torch

    times = []
    for rnd in range(1, rounds + 1):
        start = time.perf_counter()
        states, sizes = [], []
        for cid, (x, y) in data.items():
            local.load_state_dict(global_model.state_dict())
            train_client(local, x, y, seed, rnd, cid, **train)
            states.append(
                {
                    k: v.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
                    for k, v in local.state_dict().items()
                }
            )
            sizes.append(len(x))
        global_model.load_state_dict(average(states, sizes))
        times.append(time.perf_counter() - start)
    return times


def fedkit_config(sites: Path, seed: int, engine: str) -> dict:
    config = {
        "task": "npz",
        "task.path": str(sites),
        "task.mean": [0.5],
        "task.std": [0.5],
        "model": "anchor_job:make",
        "rounds": JOB.rounds,
        "eval_every": JOB.rounds,
        "optimizer": "sgd",
        "lr": JOB.lr,
        "momentum": MOMENTUM,
        "batch_size": BATCH,
        "seed": seed,
        "device": "cpu",
        "checkpoint": False,
    }
    if JOB.model == LITE:
        config.update(
            {
                "model": LITE,
                "pretrained": True,
                "task.image_size": JOB.image_size,
                "freeze": [f"backbone.net.{p}" for p in JOB.freeze],
            }
        )
    if engine == "flower":
        config.update({"engine": "flower", "flower.client_cpus": float(THREADS)})
    return config


def run_fedkit(sites: Path, seed: int, engine: str) -> dict:
    import torch

    from fedkit_core import run

    torch.set_num_threads(THREADS)
    results = run(fedkit_config(sites, seed, engine))
    return {
        "rounds": [r["seconds"] for r in results.rounds],
        "accuracy": results.rounds[-1]["global"]["acc"],
    }


def run_fedkit_cli(sites: Path, seed: int) -> dict:
    """``fedkit run`` as a user types it, through the CLI: the run folder it writes (results,
    metrics, figures) is part of the measured process."""
    import torch
    import yaml

    from fedkit_core.cli import main

    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.yaml", Path(tmp) / "run"
        job.write_text(yaml.safe_dump(fedkit_config(sites, seed, "local")))
        if main(["run", "--config", str(job), "--out", str(out), "--quiet"]) != 0:
            raise RuntimeError("fedkit run failed")
        rounds = json.loads((out / "results.json").read_text())["rounds"]
    return {"rounds": [r["seconds"] for r in rounds], "accuracy": rounds[-1]["global"]["acc"]}


def run_flower_raw(path: Path, seed: int) -> dict:
    """The job on Flower's Message API: the ServerApp sends the global state to every node
    each round and averages the replies in client order; each ClientApp trains its client."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    torch.set_num_threads(THREADS)
    outcome: dict = {}
    server_app, client_app = ServerApp(), ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        # Ray pickles this function (and anything it closes over) with every message: the
        # cache lives in this module as the worker imports it, so it is kept per worker
        import anchor_job

        cache = anchor_job.RAW_CACHE
        torch.set_num_threads(THREADS)
        cid = client_ids()[int(context.node_config["partition-id"])]
        if "data" not in cache:
            cache["data"], cache["model"] = client_data(path, seed), make()
        x, y = cache["data"][cid]
        model = cache["model"]
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        train_client(model, x, y, seed, int(msg.content["config"]["round"]), cid)
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "config": ConfigRecord({"client": cid, "num_examples": len(x)}),
            }
        )
        return Message(content, reply_to=msg)

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        model = initial_model(seed)
        nodes: list[int] = []
        while len(nodes) < CLIENTS:
            nodes = list(grid.get_node_ids())
            time.sleep(0.05 if len(nodes) < CLIENTS else 0)
        rounds = []
        for rnd in range(1, ROUNDS + 1):
            start = time.perf_counter()
            arrays = ArrayRecord(model.state_dict())
            messages = [
                Message(
                    RecordDict({"arrays": arrays, "config": ConfigRecord({"round": rnd})}),
                    dst_node_id=node,
                    message_type="train",
                )
                for node in nodes
            ]
            replies = {}
            for reply in grid.send_and_receive(messages):
                if reply.has_error():
                    raise RuntimeError(f"client failed: {reply.error}")
                replies[str(reply.content["config"]["client"])] = reply.content
            ordered = [replies[cid] for cid in client_ids()]
            model.load_state_dict(
                average(
                    [r["arrays"].to_torch_state_dict() for r in ordered],
                    [int(r["config"]["num_examples"]) for r in ordered],
                )
            )
            rounds.append(time.perf_counter() - start)
        outcome.update(rounds=rounds, accuracy=test_accuracy(model, path))

    run_simulation(
        server_app,
        client_app,
        num_supernodes=CLIENTS,
        backend_config={"client_resources": {"num_cpus": float(THREADS), "num_gpus": 0.0}},
    )
    return outcome


def write_sites(path: Path, seed: int, out: Path) -> Path:
    """The split as an ``npz`` task file: train images ordered client by client (so fedkit's
    clients come in the same order and hold their images in the same order), with ``site``
    arrays; val and test are shared out in contiguous blocks (pooled, they are the splits)."""
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    parts = split_indices(len(arrays["train_images"]), seed)
    order = np.concatenate(parts)
    ids = client_ids()
    arrays["train_images"] = arrays["train_images"][order]
    arrays["train_labels"] = arrays["train_labels"][order]
    arrays["site"] = np.repeat(ids, [len(p) for p in parts])
    for split in ("val", "test"):
        blocks = np.array_split(np.arange(len(arrays[f"{split}_images"])), JOB.clients)
        arrays[f"{split}_site"] = np.repeat(ids, [len(b) for b in blocks])
    np.savez(out, **arrays)
    return out


# ---------------------------------------------------------------------------- measuring


def tree_pss(root: int) -> int:
    """Bytes of proportional set size of ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


#: seconds between two samples of a process tree's PSS: reading ``smaps_rollup`` walks every
#: page table of the tree (a Ray tree of ~1.7 GB), and sampling every 0.2 s cost the measured
#: job ~0.25 s of each ~2.3 s round on 2 cores; the peak is a plateau held for many seconds
PSS_EVERY = 1.0


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str | None]:
    """Run ``cmd`` in a fresh process: its wall seconds, the peak PSS of its process tree
    (sampled every ``PSS_EVERY`` s) and, when it fails, the tail of its stderr (else
    ``None``). Its stderr goes to a file, not a pipe nobody reads while it runs (a pipe
    holds 64 KiB: a chattier process would block on it)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_pss(proc.pid))
            # returns as soon as it exits: the wall time is not rounded to a sample
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=PSS_EVERY)
        wall = time.perf_counter() - start
        stderr.seek(0)
        error = stderr.read().decode(errors="replace")[-3000:] if proc.returncode else None
    return wall, peak, error


def worker_env(same_malloc: bool = False) -> dict[str, str]:
    """The environment of a benchmark's worker process: this checkout and the benchmarks
    first on the path, ``THREADS`` OpenMP threads. ``same_malloc``: glibc's malloc
    thresholds set as fedkit sets them in a process that trains clients
    (:mod:`fedkit_core.allocator`), for every process of every mode."""
    path = [str(ROOT / "benchmarks"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": str(THREADS)}
    if same_malloc:
        from fedkit_core.allocator import MMAP_THRESHOLD, TRIM_THRESHOLD

        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
        env["MALLOC_TRIM_THRESHOLD_"] = str(TRIM_THRESHOLD)
    return env


def measure(
    mode: str, data: Path, sites: Path, seed: int, same_malloc: bool = False
) -> dict | None:
    """Run one mode in a fresh process; its wall time, peak tree PSS and its own report.
    ``same_malloc``: see :func:`worker_env`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = worker_env(same_malloc)
        cmd = [sys.executable, __file__, "--worker", mode, "--data", str(data)]
        cmd += ["--sites", str(sites), "--seed", str(seed), "--report", str(report)]
        cmd += ["--job", json.dumps(asdict(JOB))]
        wall, peak, error = run_measured(cmd, env)
        if error is not None:
            print(f"{mode} failed:\n{error}", file=sys.stderr)
            return None
        out = json.loads(report.read_text())
    return {
        "wall": wall,
        "round": statistics.median(out["rounds"][1:-1]),  # see the module docstring
        "first": out["rounds"][0],
        "outside": wall - sum(out["rounds"]),
        "pss": peak,
        "accuracy": out["accuracy"],
    }


#: (mode, its baseline): the pairs whose per-repeat ratios are summarised
PAIRS = (("fedkit-local", "bare"), ("fedkit-run", "bare"), ("fedkit-flower", "flower-raw"))


def paired_ratio(values: list[float], baseline: list[float]) -> tuple[float, float, float]:
    """The geometric mean of ``values[k] / baseline[k]`` and its 95% confidence interval:
    fedkit's paired t interval (:func:`fedkit_core.metrics.paired.paired_difference`) on
    the log ratios, brought back by ``exp``. Times are positive and their noise is
    multiplicative, so the log makes a ratio and its reciprocal symmetric."""
    from fedkit_core.metrics.paired import paired_difference

    diff = paired_difference(np.log(values), np.log(baseline), higher_is_better=False)
    low, high = diff["ci_t"]
    return float(np.exp(diff["mean"])), float(np.exp(low)), float(np.exp(high))


def worker(args: argparse.Namespace) -> None:
    global JOB
    job = json.loads(args.job)
    JOB = Job(**{**job, "freeze": tuple(job["freeze"])})
    seed = args.seed
    if args.worker == "bare":
        out = run_bare(args.data, seed)
    elif args.worker == "flower-raw":
        out = run_flower_raw(args.data, seed)
    elif args.worker == "fedkit-run":
        out = run_fedkit_cli(args.sites, seed)
    else:
        out = run_fedkit(args.sites, seed, "flower" if args.worker == "fedkit-flower" else "local")
    args.report.write_text(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--same-malloc",
        action="store_true",
        help="run every mode with glibc's malloc thresholds as fedkit sets them where "
        "clients train (fedkit_core/allocator.py), so the baselines do not pay what fedkit "
        "avoids; by default only fedkit's processes set them",
    )
    parser.add_argument(
        "--model", choices=("cnn", LITE), default="cnn", help="the anchor CNN or EfficientNet-Lite0"
    )
    parser.add_argument("--image-size", type=int, help="resize the images (default: 28; lite: 64)")
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="at least 3")
    parser.add_argument("--train-samples", type=int, help="training images used (default: all)")
    parser.add_argument("--lr", type=float, help=f"SGD learning rate ({LR}; lite: 0.01)")
    parser.add_argument(
        "--freeze", default="", help="lite: network parts not trained, e.g. conv_stem,bn1,blocks.0"
    )
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--sites", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    lite = args.model == LITE
    changed = (args.clients, args.rounds, args.train_samples) != (CLIENTS, ROUNDS, None)
    if (lite or changed or args.image_size) and set(modes) - {"bare", "fedkit-local", "fedkit-run"}:
        parser.error("the Flower modes run the default job; the others: --modes bare,fedkit-local")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (the steady round leaves out the first and last)")
    if args.freeze and not lite:
        parser.error(f"--freeze is for --model {LITE}")
    global JOB
    JOB = Job(
        model=args.model,
        image_size=args.image_size or (64 if lite else None),
        clients=args.clients,
        rounds=args.rounds,
        train_samples=args.train_samples,
        lr=args.lr if args.lr is not None else (0.01 if lite else LR),
        freeze=tuple(p for p in args.freeze.split(",") if p),
    )
    repeats: list[dict[str, dict]] = []  # each repeat's results by mode
    with tempfile.TemporaryDirectory() as tmp:
        if lite:  # the bare loop's pretrained weights, converted here by fedkit
            import torch

            from fedkit_core.models.imagenet import build_lite

            JOB.weights = str(Path(tmp) / "lite0.pt")
            torch.save(build_lite(LITE, pretrained=True).state_dict(), JOB.weights)
        sites = write_sites(args.data, args.seed, Path(tmp) / "anchor_sites.npz")
        for repeat in range(args.repeats):
            repeats.append({})
            for mode in modes:  # alternating: noise from other load spreads over every mode
                r = measure(mode, args.data, sites, args.seed, args.same_malloc)
                if r is None:
                    continue
                repeats[-1][mode] = r
                print(
                    f"  [{repeat + 1}/{args.repeats}] {mode}: wall {r['wall']:.1f} s, "
                    f"round {r['round']:.2f} s, PSS {r['pss'] / 2**20:.0f} MiB, "
                    f"acc {r['accuracy']:.4f}",
                    file=sys.stderr,
                )
    runs = {m: [rep[m] for rep in repeats if m in rep] for m in modes}
    med = {
        m: {
            k: statistics.median(r[k] for r in rs)
            for k in ("wall", "round", "first", "outside", "pss")
        }
        for m, rs in runs.items()
        if rs
    }
    malloc = "every mode" if args.same_malloc else "fedkit's processes only"
    what = (
        f"{LITE} pretrained at {JOB.image_size} px, lr {JOB.lr}"
        + (f", frozen {','.join(JOB.freeze)}" if JOB.freeze else "")
        if lite
        else f"the anchor CNN at {JOB.image_size or 28} px"
    )
    samples = f"{JOB.train_samples} training images" if JOB.train_samples else "all training images"
    print(
        f"anchor job: {what}, {samples}, {JOB.clients} clients, {JOB.rounds} rounds, seed "
        f"{args.seed}, medians of {args.repeats}; fedkit's malloc thresholds in {malloc}"
    )
    print(
        f"{'mode':15s} {'wall s':>8s} {'round s':>8s} {'1st rnd':>8s} {'outside':>8s} "
        f"{'PSS MiB':>8s} "
        f"{'accuracy':>9s} {'wall x':>7s} {'round x':>8s} {'PSS x':>6s}"
    )
    base = med.get("bare")
    for mode, m in med.items():
        accs = sorted({round(r["accuracy"], 4) for r in runs[mode]})
        ratio = (
            (m["wall"] / base["wall"], m["round"] / base["round"], m["pss"] / base["pss"])
            if base
            else (float("nan"),) * 3
        )
        print(
            f"{mode:15s} {m['wall']:8.2f} {m['round']:8.3f} {m['first']:8.3f} "
            f"{m['outside']:8.2f} "
            f"{m['pss'] / 2**20:8.0f} {'/'.join(f'{a:.4f}' for a in accs):>9s} "
            f"{ratio[0]:7.3f} {ratio[1]:8.3f} {ratio[2]:6.3f}"
        )
    if "fedkit-flower" in med and "flower-raw" in med:
        f, r = med["fedkit-flower"], med["flower-raw"]
        print(
            f"fedkit-flower / flower-raw: wall {f['wall'] / r['wall']:.3f}, "
            f"round {f['round'] / r['round']:.3f}, PSS {f['pss'] / r['pss']:.3f}"
        )
    for mode, base_mode in PAIRS:
        pairs = [(rep[mode], rep[base_mode]) for rep in repeats if mode in rep and base_mode in rep]
        if len(pairs) < 2:
            continue
        cells = []
        for key in ("wall", "round"):
            ratio, low, high = paired_ratio([a[key] for a, _ in pairs], [b[key] for _, b in pairs])
            cells.append(f"{key} {ratio:.3f} (95% CI {low:.3f}-{high:.3f})")
        print(f"{mode} / {base_mode}, paired over {len(pairs)} repeats: " + ", ".join(cells))


if __name__ == "__main__":
    main()
