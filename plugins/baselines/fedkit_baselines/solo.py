"""Solo: every client trains its own model on its own data; nothing is uploaded or aggregated.

Reference: the local-training baseline ("Solo: clients train models locally without
communication") of M. Yan et al., "Fed-LWR: Layer-wise re-weighting for fair federated
medical image segmentation", MICCAI 2024 (and of FedCE, Jiang et al., CVPR 2023).

The whole model is private on every party: the global state is empty, clients upload no
arrays (only the built-in ``num_examples`` and loss scalars), and each client's model
continues from its own weights every round, so a run is local training on each client for
``rounds * local_epochs`` epochs. There is no global model: the pooled ``global`` scope is
empty and each client is scored with its own model (view ``local``).
"""

from __future__ import annotations

from fedkit_core.plugin import hookimpl

fedkit_api = 2
#: batch.x reaches only the model: the frozen-trunk cache may hand it the trunk's outputs
fedkit_frozen_cache = True

VIEW = "local"


@hookimpl
def fedkit_extend_model(model, ctx):
    """Everything the model holds stays on its party (extras of other plugins included)."""
    for name, _ in model.named_children():
        model.mark_private(name)


@hookimpl
def fedkit_eval_views(client):
    return {"global": None, VIEW: "logits"}


@hookimpl
def fedkit_client_view(client):
    return VIEW
