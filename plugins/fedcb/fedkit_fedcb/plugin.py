"""FedCB hooks: class-embedding statistics built once on the server from the task's class
names and a text encoder, sent to every client as server priors, and used as a frozen
classifier after a trainable projection.

Server, once (:func:`fedkit_server_priors`): ``fedcb.mu`` and ``fedcb.sigma`` (K, D). Every
party (:func:`fedkit_extend_model`): the model's head becomes ``Linear(d, D) -> L2 norm ->
(mu, sigma)``, whose statistics are non-persistent buffers, never trained, uploaded or
aggregated. Each local step adds ``T^2 / 2 sum_d h_d^2 sigma_y,d`` to the cross-entropy of
the training logits (:func:`fedkit_loss_terms`). Aggregation is the built-in FedAvg over the
trainable model.
"""

from __future__ import annotations

import logging
import re

import torch

from fedkit_core.plugin import CLASSIFICATION, FedkitError, Option, derive_seed, hookimpl
from fedkit_fedcb.classifier import FedCBHead, class_geometry, class_statistics, random_means
from fedkit_fedcb.encoders import parse_source, text_embeddings

fedkit_api = 2

MU, SIGMA = "fedcb.mu", "fedcb.sigma"
CLASSIFIERS = ("distribution", "mean-only", "random")
#: generic medical prompt templates (``{}`` is the class name); the examples give per-task sets
DEFAULT_PROMPTS = [
    "a medical image of {}.",
    "this is an image of {}.",
    "the image shows {}.",
    "an image showing {}.",
    "a photo of {}.",
    "a clinical image of {}.",
    "a diagnostic image of {}.",
    "a medical scan showing {}.",
    "an example of {}.",
    "a case of {}.",
    "findings consistent with {}.",
    "the diagnosis is {}.",
]
_PLACEHOLDER_NAMES = re.compile(r"(class)?\s*\d+")
log = logging.getLogger("fedkit.fedcb")


@hookimpl
def fedkit_options():
    return [
        Option(
            "encoder",
            str,
            "sentence-transformers:all-MiniLM-L6-v2",
            "text encoder: sentence-transformers:<name or path>, open_clip:<name> (the paper: "
            "open_clip:hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224), "
            "precomputed:<file.npz>",
        ),
        Option(
            "encoder_weights",
            str,
            None,
            "open_clip: a pretrained tag or checkpoint path ('random': tests only)",
        ),
        Option(
            "classifier",
            str,
            "distribution",
            "distribution: mean and variance of the embeddings (FedCB); mean-only: the mean "
            "alone; random: frozen random unit vectors (the paper's ablations)",
            choices=CLASSIFIERS,
        ),
        Option(
            "prompts",
            "list[str]",
            list(DEFAULT_PROMPTS),
            "prompt templates, '{}' stands for the class name (>= 2 for the variance)",
        ),
        Option(
            "class_names",
            "list[str]",
            None,
            "class names for the prompts, in label order (default: the task's own)",
        ),
        Option(
            "temperature",
            float,
            12.5,
            "T (the authors: OCT-C8 17.5 / 12.5, Kvasir-v2 12.5 / 7.5 at beta 0.05 / 0.1)",
            min=0.0,
        ),
        Option("random_dim", int, 384, "dimension D of the random classifier", min=1),
    ]


@hookimpl
def fedkit_check(server):
    opts, problems = server.options(), []
    if server.task.kind != CLASSIFICATION:
        problems.append(
            f"fedcb needs a classification task; {server.task.name!r} is a {server.task.kind} task"
        )
    if opts["classifier"] != "random":
        try:
            parse_source(opts["encoder"])
        except FedkitError as err:
            problems.append(str(err))
        fewest = 2 if opts["classifier"] == "distribution" else 1
        prompts = opts["prompts"]
        if len(prompts) < fewest:
            problems.append(
                f"fedcb.classifier={opts['classifier']} needs at least {fewest} prompts "
                f"(the variance of one embedding is undefined), got {len(prompts)}"
            )
        bad = [p for p in prompts if p.count("{}") != 1]
        if bad and not opts["encoder"].startswith("precomputed:"):
            problems.append(f"each fedcb.prompts template needs exactly one '{{}}': {bad}")
    return problems or None


@hookimpl
def fedkit_server_priors(server):
    """The frozen classifier, once: ``mu`` and ``sigma`` per class, in the task's label order."""
    opts = server.options()
    names = class_names(server)
    if opts["classifier"] == "random":
        g = torch.Generator().manual_seed(derive_seed(server.config["seed"], "fedcb.random"))
        mu = random_means(len(names), opts["random_dim"], g)
        return {MU: mu, SIGMA: torch.zeros_like(mu)}
    texts = [[template.format(name) for template in opts["prompts"]] for name in names]
    log.info("fedcb: %s on %d classes x %d prompts", opts["encoder"], len(names), len(texts[0]))
    embeddings = text_embeddings(opts["encoder"], opts["encoder_weights"], texts, names)
    mu, sigma = class_statistics(embeddings, variance=opts["classifier"] == "distribution")
    return {MU: mu, SIGMA: sigma}


@hookimpl
def fedkit_summary(server, scopes):
    """The frozen classifier's geometry (``fedcb.mean_cos``, ``min_cos``, ``max_cos``: the
    cosines between its class vectors, see :func:`class_geometry`), in every evaluation, so
    a run says how separable the classes it was given were (text vs random vectors)."""
    mu = server.priors.get(MU)
    if mu is None or len(mu) < 2:
        return {}
    return {f"fedcb.{k}": v for k, v in class_geometry(mu).items()}


def class_names(server) -> list[str]:
    """The names the prompts are built from, one per label, in label order."""
    task_names = list(server.task.class_names)
    names = server.options()["class_names"]
    if names is None:
        if all(_PLACEHOLDER_NAMES.fullmatch(n.strip().lower()) for n in task_names):
            log.warning(
                "fedcb: the task's class names %s say nothing about the classes; set "
                "fedcb.class_names to real names (in label order)",
                task_names,
            )
        return task_names
    if len(names) != len(task_names):
        raise FedkitError(
            f"fedcb.class_names has {len(names)} names, the task has {len(task_names)} "
            f"classes ({task_names})"
        )
    return list(names)


@hookimpl
def fedkit_extend_model(model, ctx):
    if model.feature_dim is None:
        raise FedkitError("fedcb needs a model with a pooled feature (backbone -> head)")
    if MU not in ctx.priors or SIGMA not in ctx.priors:
        raise FedkitError("fedcb's statistics did not arrive: the server must run fedcb too")
    model.head = FedCBHead(
        model.feature_dim, ctx.priors[MU], ctx.priors[SIGMA], ctx.options()["temperature"]
    )


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    """``T^2 / 2 sum_d h_d^2 sigma_y,d``, averaged over the batch (absent without variance)."""
    head = client.model.head
    if not bool(head.sigma.any()):
        return None
    h = head.embed(outputs["features"])
    return {"fedcb.variance": head.variance_penalty(h, batch.y).mean()}
