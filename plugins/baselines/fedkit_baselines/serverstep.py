"""The server's step on the clients' mean update, shared by the server-optimiser baselines.

FedAdam, FedYogi and FedAdagrad (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 2) and FedAvgM (Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification", 2019) treat the FedAvg mean of the client
models as a step proposal: with ``x`` the previous global model and ``Delta = mean - x`` the
pseudo-gradient (weighted by ``num_examples``),

    FedAvgM     m = momentum * m + (x - mean);           x <- x - eta * m
    FedAdagrad  m = b1 m + (1 - b1) Delta;  v = v + Delta^2
    FedAdam     m = b1 m + (1 - b1) Delta;  v = b2 v + (1 - b2) Delta^2
    FedYogi     m = b1 m + (1 - b1) Delta;  v = v - (1 - b2) Delta^2 sign(v - Delta^2)
                (adaptive)                  x <- x + eta * m / (sqrt(v) + tau)

on the trainable parameters; ``m`` and ``v`` start at zero (as in Flower's and FLamby's
implementations). Buffers (batch-norm statistics) and integer entries are not parameters:
they take the FedAvg mean. The moments live in the server's plugin state, so checkpoints
carry them and ``fedkit resume`` continues with them.

The helpers here work on plain tensors; each plugin module (``fedadam``...) declares its own
options and hooks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedkit_core.plugin import FedModel, Option, Update, weighted_average

#: the pseudo-gradient's second-moment rules, by method
SECOND_MOMENTS = ("adagrad", "adam", "yogi")


def trainable_names(model: FedModel) -> list[str]:
    """The shared entries that are trainable parameters (the rest are buffers)."""
    return sorted(
        name
        for name, p in model.named_parameters()
        if p.requires_grad and not model.is_private(name)
    )


def remember_parameters(model: FedModel, ctx) -> None:
    """On the server: keep the names of the global state's trainable parameters in the
    plugin's state (``params``), for aggregators that treat parameters and buffers apart.
    Plugins extend the model before the core applies ``freeze``, so the parameters under a
    ``freeze`` prefix (which the clients do not train) are left out here, as the clients
    leave them out (SCAFFOLD's control variates must cover the same parameters on both)."""
    if ctx.client_id is None:
        frozen = list(ctx.config["freeze"] or ())
        ctx.state["params"] = [
            n
            for n in trainable_names(model)
            if not any(n == p or n.startswith(p + ".") for p in frozen)
        ]


def fedavg_mean(updates: Sequence[Update]) -> dict[str, torch.Tensor]:
    """The clients' models averaged by ``num_examples`` (FedAvg), every entry."""
    return weighted_average([u.arrays for u in updates], [u.num_examples for u in updates])


def split(state: Mapping[str, torch.Tensor], params: Sequence[str]) -> tuple[list[str], list[str]]:
    """``state``'s floating-point parameter names and every other name (buffers, counters)."""
    stepped = [n for n in params if n in state and state[n].dtype.is_floating_point]
    chosen = set(stepped)
    return stepped, [n for n in state if n not in chosen]


def adaptive_step(
    rule: str,
    x: Mapping[str, torch.Tensor],
    mean: Mapping[str, torch.Tensor],
    moments: dict[str, dict[str, torch.Tensor]],
    *,
    eta: float,
    beta1: float,
    beta2: float,
    tau: float,
    eta_scale: float = 1.0,
) -> dict[str, torch.Tensor]:
    """One FedAdagrad / FedAdam / FedYogi step (``rule``) of every entry of ``x`` towards
    ``mean``; updates ``moments`` (``{"m": {...}, "v": {...}}``, float32, missing entries
    start at zero) in place. ``eta_scale`` multiplies ``eta`` (a bias correction)."""
    if rule not in SECOND_MOMENTS:
        raise ValueError(f"unknown adaptive rule {rule!r}")
    m_all, v_all = moments.setdefault("m", {}), moments.setdefault("v", {})
    out = {}
    for name, old in x.items():
        delta = mean[name].double() - old.double()
        m = beta1 * m_all.get(name, torch.zeros_like(delta)).double() + (1 - beta1) * delta
        v = v_all.get(name, torch.zeros_like(delta)).double()
        square = delta * delta
        if rule == "adagrad":
            v = v + square
        elif rule == "adam":
            v = beta2 * v + (1 - beta2) * square
        else:
            v = v - (1 - beta2) * square * torch.sign(v - square)
        m_all[name], v_all[name] = m.float(), v.float()
        step = eta * eta_scale * m_all[name].double() / (v_all[name].double().sqrt() + tau)
        out[name] = (old.double() + step).to(old.dtype)
    return out


def momentum_step(
    x: Mapping[str, torch.Tensor],
    mean: Mapping[str, torch.Tensor],
    velocity: dict[str, torch.Tensor],
    *,
    eta: float,
    momentum: float,
) -> dict[str, torch.Tensor]:
    """One FedAvgM step of every entry of ``x`` towards ``mean``: ``velocity`` (float32,
    updated in place) ``= momentum * velocity + (x - mean)``, ``x - eta * velocity``."""
    out = {}
    for name, old in x.items():
        pseudo_gradient = old.double() - mean[name].double()
        previous = velocity.get(name, torch.zeros_like(pseudo_gradient)).double()
        velocity[name] = (momentum * previous + pseudo_gradient).float()
        out[name] = (old.double() - eta * velocity[name].double()).to(old.dtype)
    return out


def server_step(server, updates: Sequence[Update], step) -> dict[str, torch.Tensor]:
    """The new global state: ``step(x, mean)`` on the floating-point trainable parameters
    (``server.state["params"]``, see :func:`remember_parameters`), the FedAvg mean on every
    other entry."""
    mean = fedavg_mean(updates)
    stepped, rest = split(server.global_state, server.state["params"])
    new = step({n: server.global_state[n] for n in stepped}, {n: mean[n] for n in stepped})
    new.update({n: mean[n] for n in rest})
    return new


def adaptive_options(*, beta1: float, beta2: float | None) -> list[Option]:
    """The options of an adaptive server optimiser (``beta2=None``: FedAdagrad has none)."""
    options = [
        Option("eta", float, 0.01, "server learning rate eta", min=0.0),
        Option("beta1", float, beta1, "server momentum of the pseudo-gradient", min=0.0, max=1.0),
    ]
    if beta2 is not None:
        options.append(
            Option("beta2", float, beta2, "decay of the second moment v", min=0.0, max=1.0)
        )
    options.append(
        Option("tau", float, 1e-3, "adaptivity tau, added to sqrt(v) (the paper's 1e-3)", min=0.0)
    )
    return options


def adaptive_aggregate(
    server, updates: Sequence[Update], rule: str, eta_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """The hook body of FedAdagrad / FedAdam / FedYogi: :func:`adaptive_step` of the
    parameters with the plugin's options, its moments in ``server.state``."""
    opts = server.options()
    moments = server.state.setdefault("moments", {})

    def step(x, mean):
        return adaptive_step(
            rule,
            x,
            mean,
            moments,
            eta=opts["eta"],
            beta1=opts["beta1"],
            beta2=opts.get("beta2", 0.0),
            tau=opts["tau"],
            eta_scale=eta_scale,
        )

    return server_step(server, updates, step)
