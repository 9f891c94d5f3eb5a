"""FedProx: a proximal term keeping each client's weights near the received global model.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. "Federated Optimization in Heterogeneous
Networks." MLSys 2020 (arXiv:1812.06127).

Each client minimises its task loss plus ``mu/2 * ||w - w^t||^2``, with ``w^t`` the global
model it received this round. The term covers the shared (uploaded) trainable parameters;
private entries of other plugins have no global value and are left free. Aggregation is
unchanged (FedAvg, or any aggregator it is combined with). Works on any task.

The proximal term is a function of the parameters and of the received global model alone,
of no training sample: declared a parameter term, it is kept under sample-level DP-SGD
(its gradient added to the privatised gradient, see docs/privacy.md).
"""

from __future__ import annotations

from fedkit_baselines.anchors import shared_parameters, squared_distance
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2
#: batch.x reaches only the model: the frozen-trunk cache may hand it the trunk's outputs
fedkit_frozen_cache = True
#: the proximal term depends on no sample (fedkit_core.hooks.hookspecs.PARAMETER_TERMS)
fedkit_parameter_terms = ("fedprox.proximal",)


@hookimpl
def fedkit_options():
    return [
        Option("mu", float, 0.01, "weight of the proximal term mu/2 * ||w - w_global||^2", min=0.0)
    ]


@hookimpl
def fedkit_round_start(client):
    """Keep this round's received global weights (scratch: gone when the next round starts)."""
    client.scratch["global"] = shared_parameters(client.model)


@hookimpl
def fedkit_loss_terms(client, batch, outputs):
    mu = client.options()["mu"]
    return {"fedprox.proximal": 0.5 * mu * squared_distance(client.model, client.scratch["global"])}
