"""FedYogi: Yogi on the server, applied to the clients' mean update.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan. "Adaptive Federated
Optimization." ICLR 2021 (arXiv:2003.00295), Algorithm 2.

As FedAdam (:mod:`fedkit_baselines.fedadam`) with Yogi's additive second moment
``v = v - (1 - b2) Delta^2 sign(v - Delta^2)``, which grows or shrinks ``v`` by at most
``(1 - b2) Delta^2`` per round. The moments are server state: checkpointed and resumed.
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
    return serverstep.adaptive_options(beta1=0.9, beta2=0.99)


@hookimpl
def fedkit_extend_model(model, ctx):
    serverstep.remember_parameters(model, ctx)


@hookimpl
def fedkit_aggregate(server, updates, ask):
    return serverstep.adaptive_aggregate(server, updates, "yogi")
