"""The anchor job and a ResNet-18 224 px job on a GPU: a bare PyTorch loop against fedkit's
local engine, in fp32, bf16, channels-last and both (issue 16).

Jobs (both the anchor job's federation: 10 IID clients, 5 rounds of one SGD epoch each,
batch 64, lr 0.05, momentum 0.9, seeded as fedkit seeds; see benchmarks/anchor_job.py,
whose pieces this reuses):

* ``anchor``: PneumoniaMNIST at 28 px and the anchor CNN (421k parameters);
* ``resnet18``: the same images upscaled (bilinear) to 224 px and timm's ResNet-18 (1 input
  channel, 11.2M parameters), about what a medical imaging paper trains.

Without ``../shared/data/medmnist/pneumoniamnist.npz`` (``--data``) both use a synthetic
stand-in of the same shapes and sizes (two classes told apart by a bright disc), so the job
runs anywhere; the printout says which.

Variants: ``fp32``, ``bf16`` (``precision=bf16``; the bare loop autocasts its forward
passes), ``channels_last`` (``channels_last=true``; the bare loop converts model and
batches), ``bf16+cl`` (both). Modes: ``bare`` (the loop on the GPU, its data on the device,
cuDNN set deterministic as fedkit sets it) and ``fedkit-local`` (``fedkit_core.run`` on the
local engine, ``device=cuda``, ``data_on_device=auto``). Each run is a fresh process; runs
alternate over ``--repeats``; medians are printed.

Printed per job, variant and mode: process wall time, steady round (median of rounds
2..), GPU utilisation over the steady rounds (mean of ``nvidia-smi`` samples every 0.2 s
between the end of round 1 and the end of the last round), peak GPU memory allocated by
torch (``torch.cuda.max_memory_allocated``), test accuracy, and the ratios of wall time and
steady round to the bare loop of the same variant and to the bare fp32 loop.

    python benchmarks/gpu_job.py [--repeats 1] [--jobs anchor,resnet18] [--variants ...]
    python benchmarks/gpu_job.py --cpu-smoke   # no GPU: a tiny version of it all on the CPU

Without a CUDA GPU (and without ``--cpu-smoke``) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import anchor_job
import numpy as np
from anchor_job import DATA, THREADS, client_data, derive_seed, write_sites

MODES = ("bare", "fedkit-local")
#: variant -> (precision, channels_last)
VARIANTS = {
    "fp32": ("fp32", False),
    "bf16": ("bf16", False),
    "channels_last": ("fp32", True),
    "bf16+cl": ("bf16", True),
}
#: sizes of PneumoniaMNIST's splits (the synthetic stand-in has the same)
SIZES = {"train": 4708, "val": 524, "test": 624}
KINDS = ("images", "labels")


@dataclass(frozen=True)
class Job:
    """One job: the images' side and the model factory (``module:factory``)."""

    size: int
    model: str


JOBS = {"anchor": Job(28, "anchor_job:make"), "resnet18": Job(224, "gpu_job:resnet18")}
#: the CPU smoke: a few images, small sides, 2 rounds
SMOKE_JOBS = {"anchor": Job(28, "anchor_job:make"), "resnet18": Job(32, "gpu_job:resnet18")}
SMOKE_SIZES = {"train": 200, "val": 40, "test": 40}


def resnet18(num_classes: int = 2, in_channels: int = 1):
    """timm's ResNet-18 (no pretrained weights), the ``resnet18`` job's model (also
    fedkit's ``model=gpu_job:resnet18``)."""
    import timm

    return timm.create_model(
        "resnet18", pretrained=False, num_classes=num_classes, in_chans=in_channels
    )


# ---------------------------------------------------------------------------- the data


def synthetic(sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """A PneumoniaMNIST-shaped stand-in: 28 px grey noise, three in four images of class 1,
    which carry a brighter disc somewhere in the middle."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:28, :28]
    arrays = {}
    for split, n in sizes.items():
        labels = (rng.random(n) < 0.74).astype(np.uint8)
        images = rng.normal(110, 30, (n, 28, 28))
        cy, cx = rng.integers(9, 19, (2, n))
        disc = (yy[None] - cy[:, None, None]) ** 2 + (xx[None] - cx[:, None, None]) ** 2 < 25
        images += 60 * (disc & labels[:, None, None].astype(bool))
        arrays[f"{split}_images"] = np.clip(images, 0, 255).astype(np.uint8)
        arrays[f"{split}_labels"] = labels[:, None]
    return arrays


def source(path: Path, sizes: dict[str, int], real: bool, seed: int) -> dict[str, np.ndarray]:
    """PneumoniaMNIST's splits (cut to ``sizes``) when ``real``, else the stand-in."""
    if not real:
        return synthetic(sizes, seed)
    with np.load(path) as npz:
        return {f"{s}_{kind}": npz[f"{s}_{kind}"][:n] for s, n in sizes.items() for kind in KINDS}


def upscaled(images: np.ndarray, side: int) -> np.ndarray:
    """uint8 (N, h, w) images resized to (N, side, side), bilinear, in chunks."""
    if images.shape[1] == side:
        return images
    import torch
    import torch.nn.functional as F

    parts = []
    for start in range(0, len(images), 256):
        x = torch.from_numpy(images[start : start + 256, None]).float()
        y = F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)
        parts.append(y.round().clamp(0, 255).to(torch.uint8)[:, 0].numpy())
    return np.concatenate(parts)


def job_files(arrays: dict[str, np.ndarray], job: Job, seed: int, tmp: Path) -> tuple[Path, Path]:
    """The job's data file (images at the job's side) and its sites file for fedkit."""
    data = tmp / f"data-{job.size}.npz"
    if not data.exists():
        sized = {k: upscaled(v, job.size) if k.endswith("images") else v for k, v in arrays.items()}
        np.savez(data, **sized)
    return data, write_sites(data, seed, tmp / f"sites-{job.size}.npz")


# ---------------------------------------------------------------------------- the modes


def run_bare(path: Path, seed: int, job: Job, device: str, rounds: int, variant: str) -> dict:
    """The anchor job's bare loop on ``device``: data held there, model states averaged on
    the CPU as fedkit's server averages them."""
    import importlib

    import torch

    precision, channels_last = VARIANTS[variant]
    if device.startswith("cuda"):  # as fedkit's pick_device sets it
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    module, name = job.model.split(":")
    build = getattr(importlib.import_module(module), name)
    data = {cid: (x.to(device), y.to(device)) for cid, (x, y) in client_data(path, seed).items()}
    torch.manual_seed(derive_seed(seed, "model", "server"))
    global_model = build()
    local = build().to(device)
    if channels_last:
        local = local.to(memory_format=torch.channels_last)
    times = anchor_job.bare_rounds(
        global_model, local, data, rounds, seed, precision=precision, channels_last=channels_last
    )
    end = time.time()
    accuracy = anchor_job.test_accuracy(global_model.to(device), path, device)
    return {"rounds": times, "end": end, "accuracy": accuracy}


def run_fedkit(sites: Path, seed: int, job: Job, device: str, rounds: int, variant: str) -> dict:
    from fedkit_core import run

    precision, channels_last = VARIANTS[variant]
    config = anchor_job.fedkit_config(sites, seed, "local")
    config.update(
        model=job.model,
        rounds=rounds,
        eval_every=rounds,
        device=device,
        precision=precision,
        channels_last=channels_last,
    )
    results = run(config)
    return {
        "rounds": [r["seconds"] for r in results.rounds],
        "end": time.time(),
        "accuracy": results.rounds[-1]["global"]["acc"],
    }


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(THREADS)
    job = (SMOKE_JOBS if args.smoke else JOBS)[args.job]
    if args.worker == "bare":
        out = run_bare(args.data, args.seed, job, args.device, args.rounds, args.variant)
    else:
        out = run_fedkit(args.sites, args.seed, job, args.device, args.rounds, args.variant)
    cuda = args.device.startswith("cuda")
    out["peak"] = torch.cuda.max_memory_allocated() if cuda else None
    args.report.write_text(json.dumps(out))


# ---------------------------------------------------------------------------- measuring


class GpuSampler:
    """GPU utilisation (%) sampled with ``nvidia-smi`` every ``every`` seconds in a thread,
    each sample stamped with ``time.time()``; no samples where there is no nvidia-smi."""

    def __init__(self, every: float = 0.2):
        self.every, self.samples = every, []
        self.command = shutil.which("nvidia-smi")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuSampler:
        if self.command:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        query = [self.command, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            out = subprocess.run([*query, "-i", gpu], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip().isdigit():
                self.samples.append((time.time(), int(out.stdout.strip())))
            self._stop.wait(self.every)

    def mean(self, start: float, end: float) -> float | None:
        """The mean utilisation of the samples taken between ``start`` and ``end``."""
        inside = [u for t, u in self.samples if start <= t <= end]
        return statistics.mean(inside) if inside else None


def measure(args: argparse.Namespace, mode: str, job: str, variant: str, files: tuple) -> dict:
    """One mode of one job and variant in a fresh process: wall, rounds, GPU figures."""
    data, sites = files
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = anchor_job.worker_env()
        cmd = [sys.executable, __file__, "--worker", mode, "--job", job, "--variant", variant]
        cmd += ["--data", str(data), "--sites", str(sites), "--seed", str(args.seed)]
        cmd += ["--device", args.device, "--rounds", str(args.rounds), "--report", str(report)]
        cmd += ["--cpu-smoke"] if args.smoke else []
        with GpuSampler() as gpu:
            wall, _, error = anchor_job.run_measured(cmd, env)
        if error is not None:
            print(f"{job} {variant} {mode} failed:\n{error}", file=sys.stderr)
            return {}
        out = json.loads(report.read_text())
    steady = sum(out["rounds"][1:])
    return {
        "wall": wall,
        "round": statistics.median(out["rounds"][1:]),
        "util": gpu.mean(out["end"] - steady, out["end"]),
        "peak": out["peak"],
        "accuracy": out["accuracy"],
    }


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def show(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def report(job: str, runs: dict[tuple[str, str], list[dict]]) -> None:
    """The table of one job: medians per variant and mode, ratios to the bare loops."""
    med = {
        key: {k: median([r[k] for r in rs]) for k in ("wall", "round", "util", "peak")}
        for key, rs in runs.items()
        if rs
    }
    print(
        f"{'variant':14s} {'mode':13s} {'wall s':>7s} {'round s':>8s} {'GPU %':>6s} "
        f"{'peak MiB':>9s} {'accuracy':>9s} {'wall x':>7s} {'round x':>8s} "
        f"{'round x fp32 bare':>18s}"
    )
    base32 = med.get(("fp32", "bare"))
    for (variant, mode), m in med.items():
        base = med.get((variant, "bare"))
        accs = sorted({round(r["accuracy"], 4) for r in runs[(variant, mode)]})
        peak = m["peak"] / 2**20 if m["peak"] is not None else None
        print(
            f"{variant:14s} {mode:13s} {m['wall']:7.2f} {m['round']:8.3f} "
            f"{show(m['util'], '6.0f'):>6s} {show(peak, '9.0f'):>9s} "
            f"{'/'.join(f'{a:.4f}' for a in accs):>9s} "
            f"{show(m['wall'] / base['wall'] if base else None, '7.3f'):>7s} "
            f"{show(m['round'] / base['round'] if base else None, '8.3f'):>8s} "
            f"{show(m['round'] / base32['round'] if base32 else None, '18.3f'):>18s}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cpu-smoke", dest="smoke", action="store_true")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--job", choices=list(JOBS), help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--sites", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=anchor_job.ROUNDS, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    jobs = [j for j in args.jobs.split(",") if j]
    variants = [v for v in args.variants.split(",") if v]
    bad = (set(jobs) - set(JOBS)) | (set(variants) - set(VARIANTS))
    if bad:
        parser.error(
            f"unknown jobs or variants {sorted(bad)}: jobs {list(JOBS)}, variants {list(VARIANTS)}"
        )
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print(
            "gpu_job: no CUDA GPU on this machine, nothing measured "
            "(--cpu-smoke runs a tiny version on the CPU)"
        )
        return
    args.device = "cpu" if args.smoke else "cuda"
    args.rounds = 2 if args.smoke else anchor_job.ROUNDS
    real = args.data.is_file()
    sizes = SMOKE_SIZES if args.smoke else SIZES
    where = torch.cuda.get_device_name() if not args.smoke else "CPU (smoke: tiny sizes)"
    print(
        f"gpu job on {where}: {anchor_job.CLIENTS} clients, {args.rounds} rounds, seed "
        f"{args.seed}, data {'PneumoniaMNIST' if real else 'synthetic stand-in'} "
        f"({sizes['train']} training images), medians of {args.repeats}"
    )
    arrays = source(args.data, sizes, real, args.seed)
    table = SMOKE_JOBS if args.smoke else JOBS
    with tempfile.TemporaryDirectory() as tmp:
        for job in jobs:
            files = job_files(arrays, table[job], args.seed, Path(tmp))
            runs: dict[tuple[str, str], list[dict]] = {(v, m): [] for v in variants for m in MODES}
            for repeat in range(args.repeats):
                for variant in variants:
                    for mode in MODES:  # alternating: noise spreads over every mode
                        r = measure(args, mode, job, variant, files)
                        if r:
                            runs[(variant, mode)].append(r)
                            print(
                                f"  [{repeat + 1}/{args.repeats}] {job} {variant} {mode}: "
                                f"wall {r['wall']:.1f} s, round {r['round']:.3f} s",
                                file=sys.stderr,
                            )
            print(f"\njob {job}: {table[job].size} px, model {table[job].model}")
            report(job, runs)


if __name__ == "__main__":
    main()
