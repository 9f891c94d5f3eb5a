"""FedAdagrad: Adagrad on the server, applied to the clients' mean update.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan. "Adaptive Federated
Optimization." ICLR 2021 (arXiv:2003.00295), Algorithm 2.

As FedAdam (:mod:`fedkit_baselines.fedadam`) with Adagrad's second moment ``v = v +
Delta^2`` (the sum of every round's squared pseudo-gradient). Algorithm 2 keeps a momentum
``b1`` for all three methods (default 0.9 here); Flower's ``FedAdagrad`` fixes ``b1 = 0``
(``--set fedadagrad.beta1=0``). The moments are server state: checkpointed and resumed.
Works on any task.
"""

from __future__ import annotations

from fedkit_baselines import serverstep
from fedkit_core.plugin import hookimpl

fedkit_api = 2
#: batch.x reaches only the model: the frozen-trunk cache may hand it the trunk's outputs
fedkit_frozen_cache = True


@hookimpl
def fedkit_options():
    return serverstep.adaptive_options(beta1=0.9, beta2=None)


@hookimpl
def fedkit_extend_model(model, ctx):
    serverstep.remember_parameters(model, ctx)


@hookimpl
def fedkit_aggregate(server, updates, ask):
    return serverstep.adaptive_aggregate(server, updates, "adagrad")
