"""FedETF: a synthetic, fixed simplex-ETF classifier, a shared projection, personal
fine-tuning.

Reference: Z. Li, X. Shang, R. He, T. Lin, C. Wu, "No Fear of Classifier Biases: Neural
Collapse Inspired Federated Learning with Synthetic and Fixed Classifier", ICCV 2023.

The head becomes ``beta * normalize(P h) @ M``: a linear projection ``P`` of the backbone's
features, L2-normalised, against a fixed simplex equiangular tight frame ``M`` (d x K: unit
columns with pairwise cosine -1/(K-1)), scaled by a learnable temperature ``beta``. ``M`` is
generated from the run's seed identically on every party and never sent (a non-persistent
buffer); ``P`` and ``beta`` are trained and aggregated with the body. The local loss is the
balanced softmax on the client's class counts (the paper's balanced feature loss).

Personalisation (at every evaluation, on a copy of the received head): alternately
fine-tune the ETF prototypes and then the projection with plain CE, ``cycles`` times
``epochs`` epochs each, on the client's training features; the client is scored with it
(view ``personal``); the pooled ``global`` scope is the global model.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core.plugin import (
    CLASSIFICATION,
    FedkitError,
    Option,
    balanced_softmax_ce,
    derive_seed,
    hookimpl,
)

fedkit_api = 2

PERSONAL = "fedetf_personal"
VIEW = "personal"


def simplex_etf(dim: int, classes: int, generator: torch.Generator) -> torch.Tensor:
    """``sqrt(K/(K-1)) * U (I - 11^T/K)``, ``U`` (dim x K) with orthonormal random columns."""
    if classes < 2 or dim < classes:
        raise FedkitError(f"a simplex ETF of {classes} classes needs 2 <= classes <= dim ({dim})")
    u, _ = torch.linalg.qr(torch.rand(dim, classes, generator=generator, dtype=torch.float64))
    centring = torch.eye(classes, dtype=torch.float64) - 1.0 / classes
    return (math.sqrt(classes / (classes - 1)) * u @ centring).float()


class ETFHead(nn.Module):
    """Projection, L2 normalisation, fixed ETF prototypes, learnable temperature."""

    def __init__(self, in_dim: int, etf: torch.Tensor, beta: float):
        super().__init__()
        self.proj = nn.Linear(in_dim, etf.shape[0])
        self.register_buffer("etf", etf, persistent=False)
        self.beta = nn.Parameter(torch.tensor(float(beta)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.beta * F.normalize(self.proj(features), dim=1) @ self.etf


class PersonalHead(nn.Module):
    """A copy of the global ETF head whose prototypes become trainable (personal fine-tuning)."""

    def __init__(self, head: ETFHead):
        super().__init__()
        self.proj = copy.deepcopy(head.proj)
        self.beta = nn.Parameter(head.beta.detach().clone())
        self.etf = nn.Parameter(head.etf.detach().clone())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.beta * F.normalize(self.proj(features), dim=1) @ self.etf

    @torch.no_grad()
    def load_from(self, head: ETFHead) -> None:
        self.proj.load_state_dict(head.proj.state_dict())
        self.beta.copy_(head.beta)
        self.etf.copy_(head.etf)


@hookimpl
def fedkit_options():
    return [
        Option("dim", int, None, "ETF dimension (default: the feature size, at least K)", min=2),
        Option("beta", float, 10.0, "initial temperature (learnable), as the authors' CNN"),
        Option("eps", float, 1e-12, "eps of the balanced-softmax prior log(n_c / n + eps)"),
        Option(
            "cycles",
            int,
            20,
            "personal fine-tuning: alternations of prototypes then projection (authors' code: "
            "20; 0 scores the global head)",
            min=0,
        ),
        Option("epochs", int, 3, "epochs per fine-tuning phase (authors' code: 3)", min=1),
        Option("etf_lr", float, 0.1, "SGD learning rate fine-tuning the prototypes", min=0.0),
        Option("proj_lr", float, 0.05, "SGD learning rate fine-tuning the projection", min=0.0),
    ]


@hookimpl
def fedkit_check(server):
    if server.task.kind != CLASSIFICATION:
        return f"fedetf needs a classification task; {server.task.name!r} is {server.task.kind}"
    return None


@hookimpl
def fedkit_extend_model(model, ctx):
    """Replace the head by the ETF head (the same ETF on every party); clients add a private
    copy for personal fine-tuning."""
    if model.feature_dim is None:
        raise FedkitError("fedetf needs a model with features (model.feature_dim)")
    opts, classes = ctx.options(), ctx.task.num_classes
    dim = opts["dim"] or max(model.feature_dim, classes)
    generator = torch.Generator().manual_seed(derive_seed(ctx.config["seed"], "fedetf.etf"))
    model.head = ETFHead(model.feature_dim, simplex_etf(dim, classes, generator), opts["beta"])
    if ctx.client_id is not None:
        model.add_extra(PERSONAL, PersonalHead(model.head), private=True, eval_only=True)


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    """The balanced loss on the client's own class counts."""
    return balanced_softmax_ce(
        outputs["logits"], batch.y, client.log_prior(client.options()["eps"])
    )


def _features(client) -> tuple[torch.Tensor, torch.Tensor]:
    """The received backbone's features of the client's training split (eval mode)."""
    model = client.model
    was = model.training
    model.eval()
    xs, ys = [], []
    with torch.no_grad():
        for batch in client.batches("train", batch_size=client.config["eval_batch_size"]):
            xs.append(model.backbone(batch.x))
            ys.append(batch.y)
    model.train(was)
    return torch.cat(xs), torch.cat(ys)


def finetune(head: PersonalHead, features, labels, opts, batch_size, generator) -> None:
    """Alternate: the prototypes (lr ``etf_lr``), then the projection (``proj_lr``), CE."""
    phases = (([head.etf], opts["etf_lr"]), (list(head.proj.parameters()), opts["proj_lr"]))
    for _ in range(opts["cycles"]):
        for params, lr in phases:
            optimizer = torch.optim.SGD(params, lr=lr)
            for _ in range(opts["epochs"]):
                order = torch.randperm(len(labels), generator=generator).to(labels.device)
                for start in range(0, len(labels), batch_size):
                    index = order[start : start + batch_size]
                    loss = F.cross_entropy(head(features[index]), labels[index])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()


@hookimpl
def fedkit_eval_views(client):
    """Personal fine-tuning of a copy of the received head, on the client's own features."""
    opts = client.options()
    personal = client.model.extras[PERSONAL]
    personal.load_from(client.model.head)
    if opts["cycles"] and len(client.data["train"]):
        features, labels = _features(client)
        seed = derive_seed(client.config["seed"], "fedetf.finetune", client.round, client.id)
        with torch.enable_grad():
            finetune(
                personal,
                features,
                labels,
                opts,
                client.config["batch_size"],
                torch.Generator().manual_seed(seed),
            )
    return {VIEW: PERSONAL}


@hookimpl
def fedkit_client_view(client):
    return VIEW
