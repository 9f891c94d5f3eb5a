"""SCAFFOLD: control variates that correct each client's drift from the global direction.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh. "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning." ICML 2020 (arXiv:1910.06378), Algorithm 1.

The server keeps a control variate ``c`` and each client its own ``c_i`` (zero at first),
one entry per trainable shared parameter. Each round the server sends ``c`` with the model
(the fit payload ``scaffold.c/<name>``); the client adds ``c - c_i`` to the gradient of
every local step (a loss term ``<y - x, c - c_i>``, whose gradient it is), then sets

* option II (default): ``c_i+ = c_i - c + (x - y_i) / (K lr)``, i.e. the mean of the ``K``
  local gradients. fedkit computes that mean from the gradients themselves, so it stays the
  mean gradient when the local optimiser is not plain SGD (with plain SGD the two are equal,
  ``tests/test_scaffold.py``);
* option I: ``c_i+`` = the gradient of the task loss at the received model ``x`` over the
  client's training data (one extra pass),

and sends ``Delta c_i = c_i+ - c_i`` up beside its model (``scaffold.dc/<name>``, counted in
the round's bytes: SCAFFOLD moves twice FedAvg's parameter bytes). The server sets
``x <- x + eta (mean - x)`` (the FedAvg mean by ``num_examples``; buffers take the mean) and
``c <- c + sum_i Delta c_i / N`` over the ``N`` clients of the federation. ``c`` is server
state and ``c_i`` client state: both are checkpointed and resumed. Works on any task.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from fedkit_baselines import serverstep
from fedkit_baselines.anchors import shared_parameters
from fedkit_core.plugin import Channel, FedkitError, Option, Payload, hookimpl

fedkit_api = 2
#: batch.x reaches only the model: the frozen-trunk cache may hand it the trunk's outputs
fedkit_frozen_cache = True

#: fit payload prefix of the server variate ``c`` (down) and of ``Delta c_i`` (up)
VARIATE, DELTA = "scaffold.c/", "scaffold.dc/"


@hookimpl
def fedkit_options():
    return [
        Option(
            "variate",
            str,
            "II",
            "client variate update: II (the mean of the local gradients, the paper's cheap "
            "option) or I (the gradient at the received model, one extra pass)",
            choices=("I", "II"),
        ),
        Option("eta", float, 1.0, "server learning rate eta_g", min=0.0),
    ]


# ----------------------------------------------------------------------------- server


@hookimpl
def fedkit_extend_model(model, ctx):
    serverstep.remember_parameters(model, ctx)


def server_variate(server) -> dict[str, torch.Tensor]:
    """``c``, one zero-initialised entry per trainable parameter of the global state."""
    names, _ = serverstep.split(server.global_state, server.state["params"])
    if "c" not in server.state:
        server.state["c"] = {n: torch.zeros_like(server.global_state[n]) for n in names}
    return server.state["c"]


@hookimpl
def fedkit_configure_fit(server, client_id):
    return Payload(arrays={VARIATE + n: c for n, c in server_variate(server).items()})


@hookimpl
def fedkit_aggregate(server, updates, ask):
    variate = server_variate(server)
    for update in updates:
        missing = [n for n in variate if DELTA + n not in update.payload]
        if missing:
            raise FedkitError(f"scaffold: client {update.client_id} sent no {DELTA}{missing[0]}")
    total = len(server.task.client_ids)
    server.state["c"] = {
        n: c + sum(u.payload[DELTA + n].to(c.dtype) for u in updates) / total
        for n, c in variate.items()
    }
    eta = server.options()["eta"]

    def step(x, mean):
        return {
            n: (v.double() + eta * (mean[n].double() - v.double())).to(v.dtype)
            for n, v in x.items()
        }

    return serverstep.server_step(server, updates, step)


# ----------------------------------------------------------------------------- client


class GradientSum:
    """Adds up the gradients that reach ``params`` in backward passes while ``armed``."""

    def __init__(self, params: dict[str, nn.Parameter]):
        self.sums = {
            n: torch.zeros_like(p, memory_format=torch.contiguous_format) for n, p in params.items()
        }
        self.armed = False
        self.handles = [p.register_hook(self._adder(n)) for n, p in params.items()]

    def _adder(self, name: str):
        def add(grad: torch.Tensor) -> None:
            if self.armed:
                self.sums[name].add_(grad.detach())

        return add

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


#: the gradient sum of each client model during its local training (not client state: it
#: holds hooks; set in fedkit_round_start, removed in fedkit_client_report)
_SUMS: weakref.WeakKeyDictionary[nn.Module, GradientSum] = weakref.WeakKeyDictionary()


def _stop_summing(model: nn.Module) -> GradientSum | None:
    summed = _SUMS.pop(model, None)
    if summed is not None:
        summed.remove()
    return summed


def full_gradient(client, names: list[str]) -> dict[str, torch.Tensor]:
    """The task loss's gradient at the model as it is, over the client's training data
    (batches of the run's size, train mode; batch-norm statistics left as they were)."""
    model = client.model
    params = dict(model.named_parameters())
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    sums = {n: torch.zeros_like(params[n]) for n in names}
    seen = 0
    model.train()
    for batch in client.batches("train"):
        loss = client.task_loss(batch, client.forward(model, batch.x))
        grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        for n, g in zip(names, grads):
            if g is not None:
                sums[n].add_(g.detach(), alpha=len(batch.y))
        seen += len(batch.y)
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
    return {n: s / max(seen, 1) for n, s in sums.items()}


@hookimpl
def fedkit_round_start(client):
    """The received ``x``, this round's correction ``c - c_i`` and (option I) ``c_i+``."""
    model = client.model
    prefix = len(VARIATE)
    c = {
        k[prefix:]: v.to(client.device)
        for k, v in client.received.arrays.items()
        if k.startswith(VARIATE)
    }
    anchor = shared_parameters(model)
    if set(c) != set(anchor):
        raise FedkitError(
            "scaffold: the server's control variate does not match this client's trainable "
            f"shared parameters ({sorted(set(c) ^ set(anchor))[:3]})"
        )
    state = client.state
    ci = state.setdefault("ci", {n: torch.zeros_like(v, device="cpu") for n, v in c.items()})
    client.scratch["x"] = anchor
    client.scratch["correction"] = {n: c[n] - ci[n].to(client.device) for n in c}
    client.scratch["steps"] = 0
    _stop_summing(model)
    if client.options()["variate"] == "I":
        client.scratch["ci_new"] = full_gradient(client, sorted(c))
    else:
        params = dict(model.named_parameters())
        _SUMS[model] = GradientSum({n: params[n] for n in c})


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    """``<y - x, c - c_i>``: its gradient adds ``c - c_i`` to the local gradient."""
    scratch = client.scratch
    scratch["steps"] += 1
    summed = _SUMS.get(client.model)
    if summed is not None:
        summed.armed = True
    params = dict(client.model.named_parameters())
    term = sum(((params[n] - x) * scratch["correction"][n]).sum() for n, x in scratch["x"].items())
    return {"scaffold.correction": term}


@hookimpl
def fedkit_channels(server):
    """Each client's control-variate change travels beside its update, unprivatised: DP and
    secure-aggregation runs refuse SCAFFOLD before any data is loaded."""
    return [Channel(DELTA, "each client's control-variate change (its mean local gradient)")]


@hookimpl
def fedkit_client_report(client):
    """``Delta c_i`` goes up beside the model; ``c_i`` becomes ``c_i+``."""
    scratch, state = client.scratch, client.state
    summed = _stop_summing(client.model)
    steps = scratch["steps"]
    if "ci_new" in scratch:
        new = scratch["ci_new"]
    elif steps == 0:  # nothing trained: keep c_i
        new = {n: v.to(client.device) for n, v in state["ci"].items()}
    else:  # the mean local gradient without the correction
        new = {n: s / steps - scratch["correction"][n] for n, s in summed.sums.items()}
    delta = {n: (new[n].detach().cpu() - state["ci"][n]) for n in new}
    state["ci"] = {n: v.detach().cpu() for n, v in new.items()}
    return Payload(arrays={DELTA + n: d for n, d in delta.items()})
