"""Where a small model's training step goes on a GPU: the anchor CNN's SGD step (batch 64)
with its batches made four ways, and under cuDNN's settings (issue 16).

benchmarks/gpu_job.py shows fedkit's local engine at the bare loop's speed with ResNet-18
at 224 px but slower per round with the anchor CNN at 28 px, where the GPU is busy a fifth
of the time: the step is bound by the host's kernel launches, so every extra small
operation per batch shows. This measures the candidates on one client's data (all of the
training split, one process, the same model and optimiser throughout):

* ``float, device order``: images pre-scaled to float32 on the device, labels int64, the
  epoch's shuffled order moved to the device once (the bare loop of gpu_job.py);
* ``float, host order``: the same, indexed by the host's order slice by slice (each index
  copied to the device, waiting for it: what both loops did before 2026-11-25);
* ``uint8 + normaliser, device order``: images and labels kept as fedkit keeps them
  (uint8), each batch gathered and normalised by fedkit's own ``gather`` and
  ``Normalizer`` (four more small kernels a batch: float, /255, -mean, /std) and the labels
  widened (one more);
* ``uint8 + normaliser, host order``: that with the host's order.

Then the plain step under cuDNN ``benchmark``/``deterministic`` settings (fedkit sets
``benchmark=False, deterministic=True`` on a GPU), and a profile of 20 steps: host time
(self CPU) against kernel time (self CUDA).

    python benchmarks/gpu_step.py [--data PATH] [--repeats 5] [--epochs 4]

Printed: the median time per step over ``--repeats`` (each ``--epochs`` epochs, kinds
alternating) and its ratio to the first kind. Without a CUDA GPU it runs on the CPU (where
the launches cost nothing in comparison; the ratios say so).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from anchor_job import BATCH, DATA, make, scaled  # noqa: E402

from fedkit_core.contract.data import Normalizer  # noqa: E402
from fedkit_core.devices import gather  # noqa: E402

KINDS = (
    "float, device order",
    "float, host order",
    "uint8 + normaliser, device order",
    "uint8 + normaliser, host order",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    with np.load(args.data) as npz:
        images, labels = npz["train_images"], npz["train_labels"].reshape(-1)
    data = {
        "uint8": torch.from_numpy(images[:, None].copy()).to(device),
        "uint8 labels": torch.from_numpy(labels.astype(np.uint8)).to(device),
        "float": scaled(images).to(device),
        "labels": torch.from_numpy(labels.astype(np.int64)).to(device),
    }
    steps = -(-len(images) // BATCH)
    print(f"{name}: per SGD step of the anchor CNN, batch {BATCH}, {steps} steps an epoch")
    print(f"median of {args.repeats} x {args.epochs} epochs, kinds alternating")
    trainer = Trainer(device, data)
    times = trainer.compare(KINDS, args.repeats, args.epochs)
    report(times)
    if device.type != "cuda":
        return
    settings = {f"benchmark={b}, deterministic={d}": (b, d) for b, d in CUDNN}
    times = trainer.compare(list(settings), args.repeats, args.epochs, cudnn=settings)
    print("cuDNN settings, float batches, device order:")
    report(times)
    host, kernels = trainer.profile(20)
    print(f"20 steps profiled: host (self CPU) {host:.1f} ms, kernels (self CUDA) {kernels:.1f} ms")


#: (benchmark, deterministic): fedkit's setting first
CUDNN = ((False, True), (True, False), (False, False))


class Trainer:
    """The anchor CNN and its SGD optimiser on ``device``, trained epoch by epoch on
    ``data`` with batches made as a kind says."""

    def __init__(self, device: torch.device, data: dict[str, torch.Tensor]):
        torch.manual_seed(0)
        self.device, self.data = device, data
        self.model = make().to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.normalizer = Normalizer(mean=(0.5,), std=(0.5,))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def batch(self, kind: str, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if kind.startswith("float"):
            return self.data["float"][index], self.data["labels"][index]
        x = self.normalizer(gather(self.data["uint8"], index, self.device))
        return x, gather(self.data["uint8 labels"], index, self.device).long()

    def epoch(self, kind: str) -> None:
        n = len(self.data["labels"])
        order = torch.randperm(n)
        on_device = order.to(self.device)
        for start in range(0, n, BATCH):
            index = (order if kind.endswith("host order") else on_device)[start : start + BATCH]
            self.step(*self.batch(kind, index))

    def compare(
        self,
        kinds: list[str] | tuple[str, ...],
        repeats: int,
        epochs: int,
        cudnn: dict[str, tuple[bool, bool]] | None = None,
    ) -> dict[str, list[float]]:
        """Seconds per step of each kind (or cuDNN setting, on float batches), one warm-up
        epoch each, then ``repeats`` rounds of ``epochs`` epochs, kinds alternating."""
        times: dict[str, list[float]] = {k: [] for k in kinds}
        steps = -(-len(self.data["labels"]) // BATCH) * epochs
        for rep in range(repeats + 1):
            for kind in kinds:
                if cudnn:
                    benchmark, deterministic = cudnn[kind]
                    torch.backends.cudnn.benchmark = benchmark
                    torch.backends.cudnn.deterministic = deterministic
                self.synchronize()
                start = time.perf_counter()
                for _ in range(epochs if rep else 1):
                    self.epoch(KINDS[0] if cudnn else kind)
                self.synchronize()
                if rep:
                    times[kind].append((time.perf_counter() - start) / steps)
        return times

    def profile(self, steps: int) -> tuple[float, float]:
        """Host and kernel milliseconds of ``steps`` float steps under torch's profiler."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = CUDNN[0]
        order = torch.randperm(len(self.data["labels"])).to(self.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for start in range(0, steps * BATCH, BATCH):
                self.step(*self.batch(KINDS[0], order[start : start + BATCH]))
            self.synchronize()
        events = prof.key_averages()
        host = sum(e.self_cpu_time_total for e in events) / 1e3
        kernels = sum(  # as torch's own table sums them (device events only)
            e.self_device_time_total
            for e in events
            if e.device_type == DeviceType.CUDA and not e.is_user_annotation
        )
        return host, kernels / 1e3

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def report(times: dict[str, list[float]]) -> None:
    base = statistics.median(next(iter(times.values())))
    for kind, seconds in times.items():
        median = statistics.median(seconds)
        print(
            f"  {kind:36s} {median * 1e6:8.1f} us  {median / base:6.3f}x"
            f"  (min {min(seconds) * 1e6:.1f}, max {max(seconds) * 1e6:.1f})"
        )


if __name__ == "__main__":
    main()
