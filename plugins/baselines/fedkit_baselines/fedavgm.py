"""FedAvgM: server momentum on the clients' mean update.

Hsu, Qi, Brown. "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification." arXiv:1909.06335, 2019.

With ``x`` the previous global model and ``mean`` the FedAvg mean of the client models, the
server keeps a velocity ``v = momentum * v + (x - mean)`` and sets ``x <- x - eta * v`` on the
trainable parameters (buffers take the FedAvg mean); ``momentum = 0`` and ``eta = 1`` is
FedAvg. Flower's ``FedAvgM`` computes the same. The velocity is server state: checkpointed
and resumed. Works on any task.
"""

from __future__ import annotations

from fedkit_baselines import serverstep
from fedkit_core.plugin import Option, hookimpl

fedkit_api = 2


@hookimpl
def fedkit_options():
    return [
        Option("eta", float, 1.0, "server learning rate eta", min=0.0),
        Option("momentum", float, 0.9, "server momentum (the paper's beta)", min=0.0, max=1.0),
    ]


@hookimpl
def fedkit_extend_model(model, ctx):
    serverstep.remember_parameters(model, ctx)


@hookimpl
def fedkit_aggregate(server, updates, ask):
    opts = server.options()
    velocity = server.state.setdefault("velocity", {})

    def step(x, mean):
        return serverstep.momentum_step(
            x, mean, velocity, eta=opts["eta"], momentum=opts["momentum"]
        )

    return serverstep.server_step(server, updates, step)
