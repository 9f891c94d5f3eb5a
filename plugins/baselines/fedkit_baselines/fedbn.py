"""FedBN: batch-norm layers stay on each client; everything else is averaged.

Li, Jiang, Zhang, Kamp, Dou. "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization." ICLR 2021 (arXiv:2102.07623), Algorithm 1.

Every batch-norm layer (its weight, bias and running statistics) is private on every party:
never uploaded, aggregated or in the global state, and each client keeps its own across
rounds. The rest is FedAvg (or any aggregator it is combined with). It is ``bn=local`` made
a method: a model without batch-norm layers is refused. A client is evaluated with its own
batch-norm layers; the pooled ``global`` view is the global weights with each client's own
batch norm (there is no single global model), and results.json says so
(``normalisation.bn = local``). Works on any task whose model has batch norm.
"""

from __future__ import annotations

from fedkit_core.plugin import FedkitError, hookimpl

fedkit_api = 2


@hookimpl
def fedkit_extend_model(model, ctx):
    if not model.keep_batch_norm_local():
        raise FedkitError(
            f"fedbn keeps the batch-norm layers local, but this model (model="
            f"{ctx.config['model']}) has none"
        )
