"""q-FedAvg: the q-FFL objective's update, raising the weight of clients with a high loss.

Li, Sanjabi, Beirami, Smith. "Fair Resource Allocation in Federated Learning." ICLR 2020
(arXiv:1905.10497), Algorithm 2.

Each client reports ``F_k``, its task loss at the received global model ``w^t`` on its own
training data (one forward pass before training), and ``||w^t - w_k||^2`` over the shared
trainable parameters after training. With ``L`` the Lipschitz estimate (the paper uses
``1/lr``, the round's learning rate) the server computes

    Delta_k = F_k^q * L * (w^t - w_k)
    h_k     = q * F_k^(q-1) * L^2 * ||w^t - w_k||^2 + L * F_k^q
    w^{t+1} = w^t - sum_k Delta_k / sum_k h_k

(``F_k + 1e-10`` as in the authors' code) for every floating-point state entry; integer
entries (batch-norm counters) are averaged by ``num_examples``. ``q = 0`` is the unweighted
mean of the client models (FedAvg with uniform weights). Works on any task.
"""

from __future__ import annotations

import torch

from fedkit_baselines.anchors import evaluating, shared_parameters, squared_distance
from fedkit_core.plugin import (
    INDIVIDUAL,
    Channel,
    FedkitError,
    Option,
    hookimpl,
    lr_at,
    weighted_average,
)

fedkit_api = 2

LOSS, DISTANCE = "qfedavg.loss", "qfedavg.sqdist"


@hookimpl
def fedkit_options():
    return [
        Option("q", float, 1.0, "fairness parameter q of q-FFL (0 = uniform FedAvg)", min=0.0),
        Option(
            "lipschitz",
            float,
            None,
            "Lipschitz estimate L (null: 1/lr of the round, as the paper)",
            gt=0,
        ),
    ]


@hookimpl
def fedkit_check(server):
    """``L = 1/lr`` reads the local change ``w^t - w_k`` as ``lr`` times the summed gradients,
    which holds for SGD only: with Adam the server step shrinks to almost nothing."""
    config = server.config
    if config["optimizer"] != "sgd" and server.options()["lipschitz"] is None:
        return (
            f"qfedavg estimates L = 1/lr, which assumes SGD local steps (the paper's); with "
            f"optimizer={config['optimizer']} the global model barely moves. Set "
            "optimizer=sgd, or give qfedavg.lipschitz"
        )
    return None


@hookimpl
def fedkit_round_start(client):
    """``F_k(w^t)``: the mean task loss of the received global model on the training data."""
    client.scratch["global"] = shared_parameters(client.model)
    total, n = 0.0, 0
    with torch.no_grad(), evaluating(client.model):
        for batch in client.batches("train", batch_size=client.config["eval_batch_size"]):
            loss = client.task_loss(batch, client.model(batch.x))
            total += float(loss) * len(batch.y)
            n += len(batch.y)
    client.scratch["loss"] = total / max(n, 1)


@hookimpl
def fedkit_client_report(client):
    with torch.no_grad():
        distance = float(squared_distance(client.model, client.scratch["global"]))
    return {LOSS: client.scratch["loss"], DISTANCE: distance}


def qffl_update(
    global_state: dict[str, torch.Tensor],
    states: list[dict[str, torch.Tensor]],
    losses: list[float],
    distances: list[float],
    q: float,
    lipschitz: float,
) -> dict[str, torch.Tensor]:
    """Algorithm 2's server step on every floating-point entry of ``global_state``."""
    powered = [(f + 1e-10) ** q for f in losses]
    h = sum(
        q * (f + 1e-10) ** (q - 1) * lipschitz**2 * d + lipschitz * fq
        for f, d, fq in zip(losses, distances, powered)
    )
    out = {}
    for key, w in global_state.items():
        if not w.dtype.is_floating_point:
            continue
        delta = sum(
            fq * lipschitz * (w.double() - s[key].double()) for fq, s in zip(powered, states)
        )
        out[key] = (w.double() - delta / h).to(w.dtype)
    return out


@hookimpl
def fedkit_channels(server):
    """Each client's loss and update distance, weighting its own update (q-FFL's h_k)."""
    return [
        Channel(LOSS, "each client's training loss of the global model"),
        Channel(DISTANCE, "the squared norm of each client's update"),
        Channel(
            "qfedavg.step",
            "the server step weights each client's update by its own loss to the power q",
            kind=INDIVIDUAL,
        ),
    ]


@hookimpl
def fedkit_aggregate(server, updates, ask):
    opts = server.options()
    missing = [u.client_id for u in updates if LOSS not in u.scalars or DISTANCE not in u.scalars]
    if missing:
        raise FedkitError(f"qfedavg: clients {missing} sent no {LOSS}/{DISTANCE}")
    lipschitz = opts["lipschitz"] or 1.0 / lr_at(server.config, server.round)
    states = [u.arrays for u in updates]
    new = qffl_update(
        server.global_state,
        states,
        [float(u.scalars[LOSS]) for u in updates],
        [float(u.scalars[DISTANCE]) for u in updates],
        opts["q"],
        lipschitz,
    )
    counters = [k for k in server.global_state if k not in new]
    if counters:
        new.update(
            weighted_average(
                [{k: s[k] for k in counters} for s in states], [u.num_examples for u in updates]
            )
        )
    return new
