"""Fed-LWR's hooks: the anchor round trip on the server, the similarity query on clients.

Round ``t`` (Yan et al., Alg. 1): clients train as usual; the server averages their models
uniformly into an *anchor*, sends it back with the query ``fed-lwr.cka``; each client
measures, per layer, the similarity between its local model and the anchor on its own
training data (the paper's Eq. 3; ``split: val``, the authors' code: its validation split) and
replies with one scalar per layer (``fed-lwr.cka.<module name>``);
the server turns them into per-layer client weights and re-aggregates layer by layer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from fedkit_core.plugin import (
    INDIVIDUAL,
    Ask,
    Channel,
    ClientContext,
    FedkitError,
    Option,
    Reply,
    Scalar,
    ServerContext,
    Update,
    hookimpl,
    weighted_average,
)
from fedkit_core.plugin import QUERY as CHANNEL_QUERY
from fedkit_fed_lwr.cka import ESTIMATORS, MIN_BLOCK
from fedkit_fed_lwr.layers import DEFAULT_TYPES, deepest_layer, find_layers
from fedkit_fed_lwr.similarity import MEASURES, layer_similarity
from fedkit_fed_lwr.weights import (
    CLIPPED,
    DEFAULT_CLIP,
    EQ5,
    NO_CLIP,
    client_weights,
    layer_weights,
    reaggregate,
    weights_record,
)

fedkit_api = 2
#: why aggregation=fedbuff/fedasync cannot run Fed-LWR (see fedkit_core/engines/asynchronous.py)
fedkit_asynchronous = (
    "its layer-wise weights come from an extra round trip in which every client of the "
    "round scores the same anchor batch with its model (CKA): asynchronous updates arrive "
    "one by one, trained on different global models, with no round of clients to ask"
)

QUERY = "fed-lwr.cka"
PREFIX = QUERY + "."
log = logging.getLogger("fedkit.fed-lwr")


@hookimpl
def fedkit_options() -> list[Option]:
    return [
        Option(
            "similarity",
            str,
            "cka",
            "feature similarity: linear CKA (the method) or cosine (the paper's ablation v1)",
            choices=MEASURES,
        ),
        Option(
            "granularity",
            str,
            "layer",
            "layer: one weight per client and layer (the method); model: one weight per client "
            "from a single layer for the whole model (the paper's ablation v2)",
            choices=("layer", "model"),
        ),
        Option(
            "layer",
            str,
            None,
            "granularity=model: the module whose similarity weighs the whole model "
            "(default: the last layer at the lowest resolution, the end of a U-Net encoder)",
        ),
        Option(
            "layer_types",
            "list[str]",
            list(DEFAULT_TYPES),
            "module classes that count as layers (a class name, with or without 1d/2d/3d)",
        ),
        Option(
            "split",
            str,
            "train",
            "client split the similarity is measured on: train (the paper's Eq. 3, the default) "
            "or val (the authors' code)",
            choices=("val", "train"),
        ),
        Option(
            "batch_size",
            int,
            None,
            f"samples per Gram block (at least {MIN_BLOCK}; default: the run's batch_size)",
        ),
        Option(
            "passes",
            int,
            1,
            "passes over the split, each shuffled when more than one (the authors' code makes 5)",
            min=1,
        ),
        Option(
            "estimator",
            str,
            "unbiased",
            "HSIC estimator: unbiased (the authors' code) or biased (the paper's Eq. 2)",
            choices=ESTIMATORS,
        ),
        Option(
            "clip",
            "list[float]",
            list(DEFAULT_CLIP),
            "[low, high]: the similarity is clipped to this range before 1 - similarity "
            "(weighting=clipped)",
        ),
        Option(
            "weighting",
            str,
            CLIPPED,
            "clipped: 1 - similarity clipped to `clip` (the authors' code, default); eq5: the "
            "paper's Eq. 5 as printed, no clip (similarity bounded to CKA's range [0, 1]; a "
            "layer where every client measures 1 keeps the uniform average)",
            choices=(CLIPPED, EQ5),
        ),
    ]


@hookimpl
def fedkit_check(server: ServerContext) -> list[str]:
    config, opts = server.config, server.options()
    problems = []
    block = opts["batch_size"] or config["batch_size"]
    if opts["similarity"] == "cka" and block < MIN_BLOCK:
        problems.append(
            f"fed-lwr computes CKA on blocks of at least {MIN_BLOCK} samples; set "
            f"fed-lwr.batch_size={MIN_BLOCK} or more (now {block})"
        )
    clip = opts["clip"]
    if len(clip) != 2 or not 0 <= clip[0] <= clip[1] < 1:
        problems.append(f"fed-lwr.clip must be [low, high] with 0 <= low <= high < 1, got {clip}")
    if opts["layer"] is not None and opts["granularity"] != "model":
        problems.append("fed-lwr.layer is only used with fed-lwr.granularity=model")
    return problems


# ----------------------------------------------------------------------------- server


@hookimpl
def fedkit_channels(server: ServerContext) -> list[Channel]:
    """The CKA query and the layer-wise re-aggregation of each client's update."""
    return [
        Channel(
            QUERY,
            "each client's per-layer CKA between its trained model and the anchor, on its own data",
            kind=CHANNEL_QUERY,
        ),
        Channel(
            "fed-lwr.weights",
            "layer-wise weights per client applied to each client's update",
            kind=INDIVIDUAL,
        ),
    ]


@hookimpl
def fedkit_aggregate(
    server: ServerContext, updates: Sequence[Update], ask: Ask
) -> dict[str, torch.Tensor]:
    """Uniform anchor -> clients' per-layer similarities -> layer-wise re-aggregation."""
    opts = server.options()
    states = [u.arrays for u in updates]
    anchor = weighted_average(states, [1.0] * len(states))
    replies = ask(QUERY, arrays=anchor)
    similarities = [
        _similarities(replies[u.client_id]) if u.client_id in replies else {} for u in updates
    ]
    ids = [u.client_id for u in updates]
    clip = NO_CLIP if opts["weighting"] == EQ5 else opts["clip"]
    if opts["granularity"] == "model":
        return _whole_model(server, ids, states, similarities, anchor, clip)
    weights = layer_weights(similarities, clip)
    _report(server, ids, similarities, weights)
    return reaggregate(states, weights, anchor)


def _similarities(reply: Reply) -> dict[str, float]:
    return {
        key[len(PREFIX) :]: float(value)
        for key, value in reply.scalars.items()
        if key.startswith(PREFIX)
    }


def _whole_model(
    server: ServerContext,
    ids: list[str],
    states: list[dict[str, torch.Tensor]],
    similarities: list[dict[str, float]],
    anchor: dict[str, torch.Tensor],
    clip: Sequence[float],
) -> dict[str, torch.Tensor]:
    reported = set().union(*similarities)
    if len(reported) > 1:
        raise FedkitError(
            f"fed-lwr.granularity=model needs one layer, but the clients measured {sorted(reported)[:4]}"
        )
    if any(not s for s in similarities):
        _warn_once(server, ids, similarities)
        _record(server, {})
        return anchor
    (layer,) = reported
    weights = client_weights([s[layer] for s in similarities], clip)
    _report(server, ids, similarities, {layer: weights})
    return weighted_average(states, weights.tolist())


def _report(
    server: ServerContext,
    ids: list[str],
    similarities: list[dict[str, float]],
    weights: Mapping[str, torch.Tensor],
) -> None:
    """Warn (once) about layers left at the uniform average; record and log the weights."""
    _record(server, weights)
    if set().union(*similarities) - set(weights) or not weights:
        _warn_once(server, ids, similarities)
    if log.isEnabledFor(logging.DEBUG):
        for cid, sims in zip(ids, similarities):
            values = torch.tensor(list(sims.values()) or [float("nan")])
            log.debug(
                "round %d: %s similarity mean %.4f min %.4f over %d layers",
                server.round,
                cid,
                values.mean(),
                values.min(),
                len(sims),
            )
    if weights and log.isEnabledFor(logging.DEBUG):
        table = torch.stack(list(weights.values()))  # (layers, clients)
        mean, low, high = table.mean(0), table.min(0).values, table.max(0).values
        parts = [f"{c}={m:.3f} [{lo:.3f}, {hi:.3f}]" for c, m, lo, hi in zip(ids, mean, low, high)]
        log.debug("round %d: layer weights mean [min, max]: %s", server.round, ", ".join(parts))


#: server.state key of the weights' record (see :func:`fedkit_summary`)
RECORD = "weights"


def _record(server: ServerContext, weights: Mapping[str, torch.Tensor]) -> None:
    """Keep this round's :func:`weights_record` and the running count of weighted layers and
    of exactly uniform ones over all rounds so far (in the checkpointed server state)."""
    now = weights_record(weights)
    seen = server.state.get(RECORD, {"layer_rounds": 0.0, "uniform_layer_rounds": 0.0})
    layers = max(now["layers"], 1.0)  # no weighted layer: one uniform "layer" this round
    server.state[RECORD] = {
        **now,
        "layer_rounds": seen["layer_rounds"] + layers,
        "uniform_layer_rounds": seen["uniform_layer_rounds"] + now["uniform_share"] * layers,
    }


@hookimpl
def fedkit_summary(server: ServerContext, scopes: Mapping[str, Any]) -> dict[str, float]:
    """The layer weights of the last aggregation (``fed-lwr.uniform_share``: the share of
    layers whose weights are exactly uniform, ``fed-lwr.mean_dev`` / ``max_dev``: mean and
    largest ``|rho - 1/K|``) and ``fed-lwr.uniform_share_all``: the share of exactly uniform
    layer weightings over every round so far (how often the method was switched off)."""
    rec = server.state.get(RECORD)
    if not rec:
        return {}
    out = {f"fed-lwr.{k}": rec[k] for k in ("uniform_share", "mean_dev", "max_dev")}
    out["fed-lwr.uniform_share_all"] = rec["uniform_layer_rounds"] / rec["layer_rounds"]
    return out


def _warn_once(server: ServerContext, ids: list[str], similarities: list[dict[str, float]]) -> None:
    state = server.state
    if state.get("warned"):
        return
    state["warned"] = True
    most = max(map(len, similarities), default=0)
    short = [cid for cid, s in zip(ids, similarities) if len(s) < most]
    what = (
        f"clients {', '.join(short)} measured no similarity for some layers"
        if most
        else "no client measured a similarity"
    )
    log.warning(
        "fed-lwr: in round %d, %s (splits with fewer than %d samples?); "
        "those layers keep the uniform average",
        server.round,
        what,
        MIN_BLOCK,
    )


# ----------------------------------------------------------------------------- client


@hookimpl
def fedkit_answer_query(
    client: ClientContext,
    query: str,
    arrays: Mapping[str, torch.Tensor],
    scalars: Mapping[str, Scalar],
) -> Reply | None:
    """Per-layer similarity between this client's trained model and the anchor."""
    if query != QUERY:
        return None
    opts = client.options()
    model = client.model
    split = opts["split"]
    if len(client.data[split]) == 0:
        return Reply(scalars={})  # no CKA: the server falls back to uniform weights
    shared = [key for key in model.state_dict() if not model.is_private(key)]
    if set(arrays) != set(shared):
        raise FedkitError(
            "the fed-lwr anchor does not match this client's shared model entries "
            "(do all parties run the same plugins and model?)"
        )
    layers = find_layers(model, opts["layer_types"], keep=shared)
    if not layers:
        raise FedkitError(
            f"fed-lwr found no layers of types {opts['layer_types']} with shared weights in "
            "this model; set fed-lwr.layer_types (e.g. Conv,BatchNorm,Linear)"
        )
    if opts["granularity"] == "model":
        layers = [_single_layer(client, opts["layer"], layers, split)]
    block = opts["batch_size"] or client.config["batch_size"]
    values, used = layer_similarity(
        model,
        arrays,
        _inputs(client, split, block, opts),
        layers,
        measure=opts["similarity"],
        block=block,
        estimator=opts["estimator"],
    )
    log.debug("client %s: CKA of %d layers on %d %s samples", client.id, len(values), used, split)
    return Reply(scalars={PREFIX + name: v for name, v in values.items()})  # only the CKA


def _inputs(
    client: ClientContext, split: str, block: int, opts: dict[str, Any]
) -> Iterator[torch.Tensor]:
    """The split's images, in forward batches of whole blocks (larger for CKA: one forward
    pass of many blocks is faster than many small passes, and in eval mode a sample's
    features do not depend on its batch)."""
    forward = block
    if opts["similarity"] == "cka":
        forward *= max(1, client.config["eval_batch_size"] // block)
    for _ in range(opts["passes"]):
        for batch in client.batches(split, batch_size=forward, shuffle=opts["passes"] > 1):
            yield batch.x


def _single_layer(client: ClientContext, name: str | None, layers: list[str], split: str) -> str:
    if name is None:
        return deepest_layer(client.model, next(client.batches(split, batch_size=1)).x, layers)
    if name not in layers:
        raise FedkitError(
            f"fed-lwr.layer={name!r} is not a layer with shared weights of this model; "
            f"some that are: {', '.join(layers[:3])} ... {', '.join(layers[-3:])}"
        )
    return name
