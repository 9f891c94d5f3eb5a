"""FedNova: normalised averaging for clients that take different numbers of local steps.

Wang, Liu, Liang, Joshi, Poor. "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization." NeurIPS 2020 (arXiv:2007.07481), Section 4.

A client taking ``tau_i`` local steps moves ``x - y_i = lr * G_i a_i``, a combination of its
gradients with weights ``a_i``; FedAvg's mean then over-weights the clients that took more
steps (the objective drifts towards theirs). FedNova averages the normalised updates
``d_i = (x - y_i) / ||a_i||_1`` and rescales by ``tau_eff = sum_i p_i ||a_i||_1``:

    x <- x - tau_eff * sum_i p_i (x - y_i) / ||a_i||_1,        p_i = n_i / sum_j n_j

on the trainable parameters (buffers take the FedAvg mean). Each client reports
``||a_i||_1`` (``fednova.norm``) from its own step count (``fednova.steps``): ``tau_i`` for
plain SGD and for Adam (each step counted once: an approximation, the paper analyses SGD),
``(tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)`` for SGD with momentum ``rho`` (the
paper's momentum case). With equal step counts it is FedAvg. Clients with more data take
more steps per epoch, so ``tau_i`` differs whenever their sizes do. Works on any task.
"""

from __future__ import annotations

from fedkit_baselines import serverstep
from fedkit_core.plugin import FedkitError, hookimpl

fedkit_api = 2

STEPS, NORM = "fednova.steps", "fednova.norm"


def step_norm(steps: int, optimizer: str, momentum: float) -> float:
    """``||a||_1`` of ``steps`` local steps: the weight of all gradients in the update."""
    if optimizer != "sgd" or momentum == 0.0 or steps == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


@hookimpl
def fedkit_extend_model(model, ctx):
    serverstep.remember_parameters(model, ctx)


@hookimpl
def fedkit_round_start(client):
    client.scratch["steps"] = 0


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    """Counts the local steps (one call per step); adds nothing to the loss."""
    client.scratch["steps"] += 1


@hookimpl
def fedkit_client_report(client):
    steps = client.scratch["steps"]
    cfg = client.config
    return {STEPS: steps, NORM: step_norm(steps, cfg["optimizer"], cfg["momentum"])}


def normalised_step(x, states, norms, sizes):
    """FedNova's new value of every entry of ``x`` from the client values ``states``
    (clients with ``||a_i||_1 = 0`` took no step and count as not having moved)."""
    total = float(sum(sizes))
    p = [n / total for n in sizes]
    tau_eff = sum(pi * a for pi, a in zip(p, norms))
    out = {}
    for name, old in x.items():
        direction = sum(
            pi * (old.double() - s[name].double()) / a
            for pi, s, a in zip(p, states, norms)
            if a > 0
        )
        out[name] = (old.double() - tau_eff * direction).to(old.dtype)
    return out


@hookimpl
def fedkit_aggregate(server, updates, ask):
    missing = [u.client_id for u in updates if NORM not in u.scalars]
    if missing:
        raise FedkitError(f"fednova: clients {missing} sent no {NORM}")
    norms = [float(u.scalars[NORM]) for u in updates]
    sizes = [u.num_examples for u in updates]

    def step(x, mean):
        return normalised_step(x, [u.arrays for u in updates], norms, sizes)

    return serverstep.server_step(server, updates, step)
