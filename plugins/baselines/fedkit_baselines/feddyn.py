"""FedDyn: a dynamic regulariser that aligns the clients' local optima with the global one.

Acar, Zhao, Matas, Mattina, Whatmough, Saligrama. "Federated Learning Based on Dynamic
Regularization." ICLR 2021 (arXiv:2111.04263), Algorithm 1.

Client ``k`` minimises ``L_k(y) - <g_k, y> + alpha/2 ||y - x||^2`` from the received model
``x``, where ``g_k`` (its state, zero at first) tracks the gradient of ``L_k`` at its last
local model; after training ``g_k <- g_k - alpha (y_k - x)``. The server keeps
``h <- h - alpha/m sum_{k in P} (y_k - x)`` (``m`` clients in the federation, ``P`` this
round's) and sets ``x <- mean_{k in P} y_k - h / alpha`` with the uniform mean, as the paper;
buffers take the same mean. The terms cover the trainable shared parameters; ``g_k`` and
``h`` are client and server state, checkpointed and resumed. Works on any task.
"""

from __future__ import annotations

import torch

from fedkit_baselines import serverstep
from fedkit_baselines.anchors import shared_parameters, squared_distance
from fedkit_core.plugin import Option, hookimpl, weighted_average

fedkit_api = 2


@hookimpl
def fedkit_options():
    return [
        Option(
            "alpha",
            float,
            0.01,
            "weight alpha of the dynamic regulariser (the paper tries 0.1, 0.01, 0.001)",
            gt=0,
        )
    ]


# ----------------------------------------------------------------------------- client


@hookimpl
def fedkit_round_start(client):
    """Keep the received model ``x``; ``g_k`` starts at zero."""
    x = shared_parameters(client.model)
    client.scratch["x"] = x
    state = client.state
    if "grad" not in state:
        state["grad"] = {n: torch.zeros_like(v, device="cpu") for n, v in x.items()}
    client.scratch["grad"] = {n: g.to(client.device) for n, g in state["grad"].items()}


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    """``-<g_k, y - x>`` (the gradient of ``-<g_k, y>``) and ``alpha/2 ||y - x||^2``."""
    scratch, alpha = client.scratch, client.options()["alpha"]
    params = dict(client.model.named_parameters())
    linear = sum((g * (params[n] - scratch["x"][n])).sum() for n, g in scratch["grad"].items())
    return {
        "feddyn.linear": -linear,
        "feddyn.proximal": 0.5 * alpha * squared_distance(client.model, scratch["x"]),
    }


@hookimpl
def fedkit_client_report(client):
    """``g_k <- g_k - alpha (y_k - x)`` with the trained ``y_k``."""
    alpha, scratch = client.options()["alpha"], client.scratch
    params = dict(client.model.named_parameters())
    client.state["grad"] = {
        n: (g - alpha * (params[n].detach() - scratch["x"][n])).cpu()
        for n, g in scratch["grad"].items()
    }


# ----------------------------------------------------------------------------- server


@hookimpl
def fedkit_extend_model(model, ctx):
    serverstep.remember_parameters(model, ctx)


@hookimpl
def fedkit_aggregate(server, updates, ask):
    alpha = server.options()["alpha"]
    total = len(server.task.client_ids)
    mean = weighted_average([u.arrays for u in updates], [1.0] * len(updates))
    stepped, rest = serverstep.split(server.global_state, server.state["params"])
    h = server.state.setdefault("h", {n: torch.zeros_like(server.global_state[n]) for n in stepped})
    new = {}
    for n in stepped:
        x = server.global_state[n].double()
        moved = sum(u.arrays[n].double() - x for u in updates)
        h[n] = (h[n].double() - alpha / total * moved).to(h[n].dtype)
        new[n] = (mean[n].double() - h[n].double() / alpha).to(server.global_state[n].dtype)
    new.update({n: mean[n] for n in rest})
    return new
