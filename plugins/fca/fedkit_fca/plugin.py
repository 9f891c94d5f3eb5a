"""FCA's hooks: a private personalised head per client, its loss terms, G&S evaluation.

Model: the feature extractor and the federated head (``logits``) are the shared, aggregated
model; each client adds a personalised linear head ``fca_personal`` on the same features,
created on the client, private (never uploaded, aggregated or globally checkpointed; kept
and checkpointed with the client). Aggregation is the built-in FedAvg weighted by training
size, which only ever sees the shared entries.

Local loss per batch: ``l1 * BSM(federated) + l2 * BSM(personal) + consistency``.
Evaluation: generalisation = the global model's federated head on the pooled test set
(``final.global``); specialisation = each client's model with its personalised head on its
own test set (the view ``personal``, which scores the clients: ``final.clients``,
``final.clients_mean``); their mean in ``final.summary``. With
``fca.specialisation=authors_code`` the clients are scored instead as the authors' code does:
the client's locally trained model before aggregation, with its federated head (the view
``local``, a frozen private snapshot taken after each local training).
"""

from __future__ import annotations

from torch import nn

from fedkit_core.plugin import CLASSIFICATION, FedkitError, Option, hookimpl
from fedkit_fca import losses
from fedkit_fca.snapshot import LocalSnapshot

#: batch.x reaches only the model: the frozen-trunk cache may hand it the trunk's outputs
fedkit_frozen_cache = True

#: the model extra holding the personalised head; state entries ``extras.fca_personal.*``
PERSONAL = "fca_personal"
#: the evaluation view of the personalised head (specialisation)
VIEW = "personal"
#: the model extra holding the locally trained model (``specialisation=authors_code``)
LOCAL = "fca_local"
#: the evaluation view of that snapshot: the authors' specialisation
LOCAL_VIEW = "local"
#: specialisation protocols: the paper's, and the authors' code's
PAPER, AUTHORS_CODE = "paper", "authors_code"
#: metrics whose generalisation/specialisation mean goes into the summary (the paper's)
GS_METRICS = ("bacc", "bauc")


@hookimpl
def fedkit_options():
    return [
        Option("l1", float, 1.0, "weight of the federated head's calibrated loss (lambda_1)"),
        Option("l2", float, 3.0, "weight of the personalised head's calibrated loss (lambda_2)"),
        Option(
            "calibration",
            str,
            "bsm",
            "loss of both heads: bsm (balanced softmax on the client's priors, the paper) or "
            "ce (no calibration; an ablation). The core `loss` key does not apply to FCA",
            choices=("bsm", "ce"),
        ),
        Option("eps", float, 1e-9, "eps of the balanced-softmax prior log(n_c / n + eps)", min=0.0),
        Option(
            "consistency",
            str,
            losses.PAPER,
            "consistency term: paper (true KL, batchmean), authors_code (the authors' "
            "probabilities-as-log-probabilities KLDivLoss) or off (Table 7 ablation)",
            choices=losses.VARIANTS,
        ),
        Option(
            "direction",
            str,
            losses.PERSONAL_TO_FED,
            "who teaches whom (Table 8): personal_to_fed (the paper), fed_to_personal, both",
            choices=losses.DIRECTIONS,
        ),
        Option("consistency_weight", float, 1.0, "weight of the consistency term", min=0.0),
        Option(
            "specialisation",
            str,
            PAPER,
            "which model scores each client (S): paper (the global feature extractor with the "
            "client's personalised head) or authors_code (the client's locally trained model "
            "before aggregation, with its federated head, as the authors' code evaluates)",
            choices=(PAPER, AUTHORS_CODE),
        ),
    ]


@hookimpl
def fedkit_check(server):
    task = server.task
    if task.kind != CLASSIFICATION:
        return f"fca needs a classification task; {task.name!r} is {task.kind}"
    return None


@hookimpl
def fedkit_extend_model(model, ctx):
    """Each client gets its own private personalised head; the server model has none."""
    if ctx.client_id is None:
        return
    if model.feature_dim is None:
        raise FedkitError(
            "fca adds a linear head on the backbone's features, but this model exposes no "
            "feature size (model.feature_dim is None); use a classification backbone"
        )
    model.add_extra(PERSONAL, nn.Linear(model.feature_dim, ctx.task.num_classes), private=True)
    if ctx.options()["specialisation"] == AUTHORS_CODE:
        model.add_extra(LOCAL, LocalSnapshot(model), private=True, input="image")


def _log_prior(client):
    opts = client.options()
    return client.log_prior(opts["eps"]) if opts["calibration"] == "bsm" else None


@hookimpl
def fedkit_task_loss(client, batch, outputs):
    """``l1 * BSM(federated head)`` with the client's priors (eps 1e-9 as in the paper)."""
    return client.options()["l1"] * losses.head_loss(outputs["logits"], batch.y, _log_prior(client))


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    """``l2 * BSM(personalised head)`` and the weighted consistency term."""
    opts = client.options()
    personal = outputs[PERSONAL]
    terms = {"fca.personal": opts["l2"] * losses.head_loss(personal, batch.y, _log_prior(client))}
    if opts["consistency"] != losses.OFF:
        terms["fca.consistency"] = opts["consistency_weight"] * losses.consistency(
            outputs["logits"], personal, opts["consistency"], opts["direction"]
        )
    return terms


@hookimpl
def fedkit_client_report(client):
    """``specialisation=authors_code``: keep the locally trained model before aggregation."""
    if client.options()["specialisation"] == AUTHORS_CODE:
        client.model.extras[LOCAL].capture(client.model)


@hookimpl
def fedkit_eval_views(client):
    """Specialisation: the client's model with its personalised head (and, for the authors'
    protocol, its locally trained model before aggregation)."""
    views = {VIEW: PERSONAL}
    if client.options()["specialisation"] == AUTHORS_CODE:
        views[LOCAL_VIEW] = LOCAL
    return views


@hookimpl
def fedkit_client_view(client):
    """The view that scores each client (per-client scopes, fairness): the personalised head
    (the paper) or the local model before aggregation (the authors' code)."""
    return LOCAL_VIEW if client.options()["specialisation"] == AUTHORS_CODE else VIEW


@hookimpl
def fedkit_summary(server, scopes):
    """The paper's headline: the mean of generalisation and specialisation, per metric."""
    glob, spec = scopes.get("global", {}), scopes.get("clients_mean", {})
    return {f"fca.gs_{m}": (glob[m] + spec[m]) / 2 for m in GS_METRICS if m in glob and m in spec}
