"""FedPer: a shared base, personal layers that never leave the client.

Arivazhagan, Aggarwal, Singh, Choudhary. "Federated Learning with Personalization Layers."
arXiv:1912.00818, 2019.

The personal layers (``layers``: state-entry prefixes, default the classification head) are
private on every party: never uploaded, aggregated or in the global state. Base and personal
layers train together on every local step (unlike FedRep, which alternates); only the base
is averaged (FedAvg, or any aggregator it is combined with). Clients are scored with their own
personal layers on the received base (view ``personal``); there is no global model, so the
pooled ``global`` scope is empty.
"""

from __future__ import annotations

from fedkit_core.plugin import FedkitError, Option, hookimpl

fedkit_api = 2

VIEW = "personal"


@hookimpl
def fedkit_options():
    return [
        Option(
            "layers",
            "list[str]",
            ["head"],
            "the personal layers: prefixes of the model's state entries (head, or e.g. "
            "backbone.fc, backbone.layer4 for more of the network)",
        )
    ]


@hookimpl
def fedkit_extend_model(model, ctx):
    layers = ctx.options()["layers"]
    if not layers:
        raise FedkitError("fedper needs at least one personal layer (fedper.layers)")
    entries = list(model.state_dict())
    for prefix in layers:
        if not any(k == prefix or k.startswith(prefix + ".") for k in entries):
            raise FedkitError(
                f"fedper.layers: the model has no layer {prefix!r} (its layers: "
                f"{', '.join(sorted({k.rsplit('.', 1)[0] for k in entries})[:12])}...)"
            )
        model.mark_private(prefix)
    if all(model.is_private(k) for k in entries):
        raise FedkitError("fedper.layers covers the whole model: nothing would be shared")


@hookimpl
def fedkit_eval_views(client):
    return {"global": None, VIEW: "logits"}


@hookimpl
def fedkit_client_view(client):
    return VIEW
