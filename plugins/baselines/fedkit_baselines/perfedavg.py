"""Per-FedAvg: a global model trained to be a good starting point for one local step.

Fallah, Mokhtari, Ozdaglar. "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach." NeurIPS 2020 (arXiv:2002.07948), Algorithm 1 with the
first-order (FO) and Hessian-free (HF) estimates.

Each local step of a client uses three independent batches ``D`` (the core's batch),
``D'`` and ``D''`` of its training data:

    temp = w - alpha * grad f(w; D)                       (the inner step)
    FO:  g = grad f(temp; D')
    HF:  g = grad f(temp; D') - alpha * H(w; D'') grad f(temp; D')
    w   <- the run's optimiser step with gradient g      (the outer step, learning rate beta = lr)

The Hessian-vector product is the central difference ``(grad f(w + delta d) - grad f(w -
delta d)) / (2 delta)``, as the paper's HF estimate. The outer step is the run's optimiser
(plain SGD is the paper's; ``optimizer=sgd --set momentum=0``). Aggregation is FedAvg.

At evaluation each client personalises a copy of the received global model with
``eval_steps`` steps of plain SGD at ``alpha`` on batches of its own training data (the
paper's one step) and is scored with it (view ``personal``); the pooled ``global`` scope is the
global (meta) model.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from fedkit_baselines.copies import ModelCopy
from fedkit_core.plugin import Batch, Option, derive_seed, hookimpl

fedkit_api = 2

#: the model extra holding the personalised copy (eval only; private)
TUNED = "perfedavg_tuned"
VIEW = "personal"


@hookimpl
def fedkit_options():
    return [
        Option(
            "variant",
            str,
            "fo",
            "fo (first-order) or hf (Hessian-free: a Hessian-vector product by finite "
            "differences on a third batch)",
            choices=("fo", "hf"),
        ),
        Option(
            "alpha", float, 0.01, "step size alpha of the inner and the evaluation step", min=0.0
        ),
        Option("delta", float, 1e-3, "finite-difference step delta of the HF estimate", gt=0),
        Option(
            "eval_steps",
            int,
            1,
            "SGD steps at alpha personalising the model before evaluation (0: none)",
            min=0,
        ),
    ]


@hookimpl
def fedkit_extend_model(model, ctx):
    if ctx.client_id is not None:
        model.add_extra(TUNED, ModelCopy(model), private=True, input="image", eval_only=True)


class MetaGradient:
    """Replaces the gradient of each step of one client optimiser by Per-FedAvg's (an
    optimiser pre-step hook: the core has just computed ``grad f(w; D)``)."""

    def __init__(self, client, params: list[torch.nn.Parameter]):
        self.client = client
        self.params = params
        self.opts = client.options()  # read now: the optimiser steps outside any hook
        self.round = None
        self.batches: Iterator[Batch] | None = None

    def next_batch(self) -> Batch:
        """The next batch of a shuffled pass over the training data, restarted as needed
        (one stream per round, drawn from the client's round-seeded generator)."""
        client = self.client
        if self.round != client.round:
            self.round, self.batches = client.round, None
        for _ in range(2):
            if self.batches is None:
                self.batches = client.batches("train", shuffle=True, augment=True)
            batch = next(self.batches, None)
            if batch is not None:
                return batch
            self.batches = None
        raise RuntimeError("perfedavg: the client has no training batch")

    def gradient(self, batch: Batch) -> list[torch.Tensor]:
        client = self.client
        loss = client.task_loss(batch, {"logits": client.forward(client.model, batch.x)["logits"]})
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads)]

    @torch.no_grad()
    def __call__(self, optimizer, args, kwargs) -> None:
        params, opts = self.params, self.opts
        alpha = opts["alpha"]
        first = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
        saved = [p.detach().clone() for p in params]
        for p, g in zip(params, first):
            p.sub_(alpha * g)
        with torch.enable_grad():
            outer = self.gradient(self.next_batch())
        for p, w in zip(params, saved):
            p.copy_(w)
        if opts["variant"] == "hf":
            batch, delta = self.next_batch(), opts["delta"]
            for p, d in zip(params, outer):
                p.add_(delta * d)
            with torch.enable_grad():
                plus = self.gradient(batch)
            for p, w, d in zip(params, saved, outer):
                p.copy_(w - delta * d)
            with torch.enable_grad():
                minus = self.gradient(batch)
            for p, w in zip(params, saved):
                p.copy_(w)
            outer = [d - alpha * (a - b) / (2 * delta) for d, a, b in zip(outer, plus, minus)]
        for p, g in zip(params, outer):
            p.grad = g


@hookimpl
def fedkit_optimizer(client, param_groups):
    """The run's own optimiser (built by the built-in hook), its steps fed Per-FedAvg's
    meta-gradient."""
    scratch = client.scratch
    if scratch.get("building"):
        return None  # the nested call below: the built-in builds the optimiser
    scratch["building"] = True
    try:
        optimizer = client.hook.fedkit_optimizer(client=client, param_groups=param_groups)
    finally:
        del scratch["building"]
    params = [p for group in param_groups for p in group["params"]]
    optimizer.register_step_pre_hook(MetaGradient(client, params))
    return optimizer


@hookimpl
def fedkit_eval_views(client):
    """``eval_steps`` SGD steps at ``alpha`` on a copy of the received global model, on
    batches and dropout drawn from a stream of their own (seed, round, client)."""
    opts = client.options()
    tuned = client.model.extras[TUNED]
    tuned.load_from(client.model)
    tuned.train()
    seed = derive_seed(client.config["seed"], "perfedavg.finetune", client.round, client.id)
    saved = client.rng
    devices = [client.device] if client.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        client.rng = torch.Generator().manual_seed(seed)
        try:
            sgd_steps(client, tuned, opts["eval_steps"], opts["alpha"])
        finally:
            client.rng = saved
    return {VIEW: TUNED}


def sgd_steps(client, model: torch.nn.Module, steps: int, lr: float) -> None:
    """``steps`` plain SGD steps of ``model`` (logits) on the task loss of the client's
    shuffled training batches."""
    params = [p for p in model.parameters() if p.requires_grad]
    batches: Iterator[Batch] | None = None
    for _ in range(steps):
        batch = next(batches, None) if batches is not None else None
        if batch is None:
            batches = client.batches("train", shuffle=True, augment=True)
            batch = next(batches, None)
        if batch is None:
            return
        with torch.enable_grad():
            loss = client.task_loss(batch, {"logits": client.forward(model, batch.x)})
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is not None:
                    p.sub_(lr * g)


@hookimpl
def fedkit_client_view(client):
    return VIEW
