"""FedCE: aggregation weighted by each client's estimated contribution.

Reference: M. Jiang, H. R. Roth, W. Li, D. Yang, C. Zhao, V. Nath, D. Xu, Q. Dou, Z. Xu,
"Fair Federated Medical Image Segmentation via Client Contribution Estimation", CVPR 2023
(the fairness baseline of Fed-LWR, Yan et al., MICCAI 2024, in its "Sum." and "Multi."
versions).

Contribution in two spaces, with the coefficients ``c_k`` of the previous round
(uniform at first):

* gradient space (server): the update ``d_k = w_k - w`` of every client against the
  consensus of the others, ``cos(d_k, sum_i c_i d_i - c_k d_k)``; the score is
  ``1 - mean`` of this cosine over the client's rounds so far (a client whose update points
  away from the others' brings something new);
* data space (client): the client scores the leave-one-out model
  ``(w - c_k w_k^prev) / (1 - c_k)`` (the global model without its own previous local
  model) on its validation split and sends ``1 - mean`` of these scores over its rounds (a
  client the others serve badly gets more weight); 0 before it has a previous model.

Both are normalised over the clients (floored at ``floor``) and merged by ``mode``: ``sum``
(Sum.) or ``product`` (Multi.); normalised again they are the new ``c_k`` and the
aggregation weights. The server sends each client only its own ``c_k``; the client sends
up only its scalar.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedkit_core.plugin import (
    INDIVIDUAL,
    Channel,
    FedkitError,
    Option,
    Payload,
    hookimpl,
    weighted_average,
)

fedkit_api = 2

COEF = "fedce.coef"
SCORE = "fedce.minus_score"


@hookimpl
def fedkit_options():
    return [
        Option(
            "mode",
            str,
            "sum",
            "how the two contributions merge: sum (the paper's Sum., the authors' default "
            "'plus') or product (Multi., 'times')",
            choices=("sum", "product"),
        ),
        Option(
            "split",
            str,
            "val",
            "client split scoring the leave-one-out model",
            choices=("val", "train"),
        ),
        Option(
            "floor", float, 1e-3, "lower clip of every normalised weight (authors: 1e-3)", min=0.0
        ),
    ]


# ----------------------------------------------------------------------------- server


@hookimpl
def fedkit_extend_model(model, ctx):
    """The server remembers which shared entries are trainable parameters (the gradient
    space); buffers such as batch-norm statistics are left out of the cosine, as coded."""
    if ctx.client_id is None:
        ctx.state["params"] = sorted(
            name
            for name, p in model.named_parameters()
            if p.requires_grad and not model.is_private(name)
        )


@hookimpl
def fedkit_configure_fit(server, client_id):
    """Each client gets its own coefficient of the last aggregation (0 if it was not in it)."""
    return Payload(scalars={COEF: float(server.state.get("last", {}).get(client_id, 0.0))})


def normalise(values: Sequence[float], floor: float) -> torch.Tensor:
    """``v / sum(v)`` floored at ``floor`` (the authors' clip after normalising); uniform
    when everything is zero."""
    v = torch.tensor(list(values), dtype=torch.float64).clamp(min=0.0)
    v = v / v.sum() if v.sum() > 0 else torch.full_like(v, 1.0 / len(v))
    return v.clamp(min=floor)


def gradient_cosines(deltas: Sequence[torch.Tensor], prior: torch.Tensor) -> list[float]:
    """``cos(d_k, sum_i c_i d_i - c_k d_k)`` for every client (0 for a zero vector)."""
    consensus = sum(c * d for c, d in zip(prior.tolist(), deltas))
    out = []
    for c, d in zip(prior.tolist(), deltas):
        rest = consensus - c * d
        if d.norm() == 0 or rest.norm() == 0:
            out.append(0.0)
        else:
            out.append(float(torch.nn.functional.cosine_similarity(d, rest, dim=0)))
    return out


def contributions(
    cos_history: Sequence[Sequence[float]],
    minus_scores: Sequence[float],
    mode: str,
    floor: float,
) -> torch.Tensor:
    """The new coefficients from each client's cosine history and its data-space score."""
    grad = normalise([1.0 - sum(h) / len(h) for h in cos_history], floor)
    data = normalise(minus_scores, floor)
    merged = grad + data if mode == "sum" else grad * data
    return normalise(merged.tolist(), floor)


@hookimpl
def fedkit_channels(server):
    """Each client's leave-one-out score, and cosines between the clients' own updates."""
    return [
        Channel(SCORE, "each client's leave-one-out score on its own validation split"),
        Channel(
            "fedce.cosines",
            "gradient cosines between each client's update and the others'",
            kind=INDIVIDUAL,
        ),
    ]


@hookimpl
def fedkit_aggregate(server, updates, ask):
    opts, state = server.options(), server.state
    names = [n for n in state["params"] if n in server.global_state]
    if not names:
        raise FedkitError("fedce needs shared trainable parameters to compare the updates")
    ids = [u.client_id for u in updates]
    last = state.get("coef", {})
    prior = normalise([last.get(cid, 1.0 / len(ids)) for cid in ids], 0.0)
    deltas = [
        torch.cat([(u.arrays[n] - server.global_state[n]).double().reshape(-1) for n in names])
        for u in updates
    ]
    history = state.setdefault("cos", {})
    for cid, cos in zip(ids, gradient_cosines(deltas, prior)):
        history.setdefault(cid, []).append(cos)
    coef = contributions(
        [history[cid] for cid in ids],
        [float(u.scalars.get(SCORE, 0.0)) for u in updates],
        opts["mode"],
        opts["floor"],
    )
    weights = coef / coef.sum()
    state["coef"] = {**last, **dict(zip(ids, coef.tolist()))}
    state["last"] = dict(zip(ids, weights.tolist()))
    return weighted_average([u.arrays for u in updates], weights.tolist())


# ----------------------------------------------------------------------------- client


@hookimpl
def fedkit_round_start(client):
    """Score the leave-one-out model on the client's own split (before local training)."""
    model, opts, state = client.model, client.options(), client.state
    c = float(client.received.scalars.get(COEF, 0.0))
    score = 0.0
    if "previous" in state and c < 1.0:
        received = model.shared_state()
        minus = {
            k: (v - c * state["previous"][k]) / (1.0 - c) if v.is_floating_point() else v
            for k, v in received.items()
        }
        model.load_shared(minus)
        metrics = client.score(opts["split"])
        model.load_shared(received)
        score = metrics.get(client.task.main_metric, 0.0)
    state.setdefault("scores", []).append(score)


@hookimpl
def fedkit_client_report(client):
    """Keep this round's local model for the next leave-one-out; send ``1 - mean score``."""
    state = client.state
    state["previous"] = client.model.shared_state()
    scores = state["scores"]
    return {SCORE: 1.0 - sum(scores) / len(scores)}
