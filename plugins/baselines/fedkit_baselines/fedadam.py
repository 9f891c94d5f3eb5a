"""FedAdam: Adam on the server, applied to the clients' mean update.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan. "Adaptive Federated
Optimization." ICLR 2021 (arXiv:2003.00295), Algorithm 2.

Clients train as in FedAvg; the server takes ``Delta = mean - x`` (the FedAvg mean of the
client models minus the previous global model) as a pseudo-gradient and moves the trainable
parameters by ``eta * m / (sqrt(v) + tau)`` with ``m = b1 m + (1 - b1) Delta`` and
``v = b2 v + (1 - b2) Delta^2`` (see :mod:`fedkit_baselines.serverstep`; buffers take the
FedAvg mean). No bias correction, as in the paper and FLamby; ``bias_correction=flower``
applies Flower's ``eta * sqrt(1 - b2^(t+1)) / (1 - b1^(t+1))`` at round ``t``. The moments are
server state: checkpointed and resumed. Works on any task.
"""

from __future__ import annotations

import math

from fedkit_baselines import serverstep
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2
#: batch.x reaches only the model: the frozen-trunk cache may hand it the trunk's outputs
fedkit_frozen_cache = True


@hookimpl
def fedkit_options():
    return [
        *serverstep.adaptive_options(beta1=0.9, beta2=0.99),
        Option(
            "bias_correction",
            str,
            "none",
            "none (the paper's Algorithm 2, as FLamby) or flower (flwr's FedAdam: eta * "
            "sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)) in round t)",
            choices=("none", "flower"),
        ),
    ]


@hookimpl
def fedkit_extend_model(model, ctx):
    serverstep.remember_parameters(model, ctx)


@hookimpl
def fedkit_aggregate(server, updates, ask):
    opts, t = server.options(), server.round
    scale = 1.0
    if opts["bias_correction"] == "flower":
        scale = math.sqrt(1 - opts["beta2"] ** (t + 1)) / (1 - opts["beta1"] ** (t + 1))
    return serverstep.adaptive_aggregate(server, updates, "adam", eta_scale=scale)
