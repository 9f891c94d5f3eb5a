"""What a run will cost, said before round 1: a few training steps of the run's model, timed
on random images of the task's shape at the run's batch size, scaled to the batches of a
round. A run of hours is known as such in its first seconds, not after its first round.

It counts the model's own work (forward, backward, optimiser step; evaluation as forward
passes), not what comes on top: reading and augmenting the data, plugins' loss terms and
queries, per-sample gradients under DP-SGD, checkpoints. The steps run on a copy of the
model; the run's random streams are left as they were (its results do not change)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import torch

from fedkit_core.contract.data import SEGMENTATION, ClientInfo
from fedkit_core.devices import place_model
from fedkit_core.engines.model import build_model
from fedkit_core.engines.selection import cohort_size
from fedkit_core.engines.server import Server
from fedkit_core.hooks.context import ClientContext

#: timed training steps (after one untimed warm-up step)
STEPS = 3
#: a forward pass of evaluation, against a training step (forward, backward, update)
FORWARD_SHARE = 1 / 3


def step_seconds(server: Server, steps: int = STEPS) -> float:
    """Seconds of one training step of the run's model at its batch size (the median of
    ``steps`` timed steps on random images, after a warm-up step)."""
    cfg, task, device = server.config, server.task, server.ctx.device
    size = cfg["batch_size"]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        ctx = ClientContext(task, cfg, device)
        model = place_model(build_model(server.plugins, ctx), device, cfg["channels_last"])
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=1e-6)
        x = torch.rand(size, task.in_channels, *task.image_shape, device=device)
        shape = (size, *task.image_shape) if task.kind == SEGMENTATION else (size,)
        y = torch.randint(task.num_classes, shape, device=device)
        times = []
        for _ in range(steps + 1):
            start = time.perf_counter()
            logits = ctx.forward(model, x)["logits"]
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def round_seconds(server: Server, infos: Mapping[str, ClientInfo], step: float) -> float:
    """Seconds one round should take at ``step`` seconds a training step: the sampled
    clients' training batches (the largest clients, an upper estimate) times
    ``local_epochs``, plus every client's validation and test batches as forward passes
    (the clients train and evaluate one after another)."""
    cfg = server.config
    sizes = sorted((info.num_train for info in infos.values()), reverse=True)
    sampled = sizes[: cohort_size(len(sizes), cfg["sample_fraction"])]
    train = sum(math.ceil(n / cfg["batch_size"]) for n in sampled) * cfg["local_epochs"]
    evaluate = sum(
        math.ceil(info.num_val / cfg["eval_batch_size"])
        + math.ceil(info.num_test / cfg["eval_batch_size"])
        for info in infos.values()
    )
    scale = cfg["eval_batch_size"] / cfg["batch_size"]  # an evaluation batch is that larger
    return step * (train + evaluate * scale * FORWARD_SHARE / max(cfg["eval_every"], 1))
