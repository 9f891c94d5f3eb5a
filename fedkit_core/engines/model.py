"""A party's model: the one builder plugin, then every plugin's extension, then the config.

The server builds the global model and each client its own the same way, so this sits
below both (:mod:`fedkit_core.engines.client`, :mod:`fedkit_core.engines.server`).
"""

from __future__ import annotations

from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext, ServerContext
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.privacy.sample_level import prepare_model


def build_model(plugins: PluginSet, ctx: ServerContext | ClientContext) -> FedModel:
    """The model for one party: the exclusive builder, then every plugin's extension, then
    the ``freeze`` config key (:meth:`FedModel.freeze`), the DP-SGD check of the layers left
    trainable, and the ``bn`` policy (``local``: every batch-norm layer private)."""
    model = plugins.hook.fedkit_build_model(ctx=ctx)
    if not isinstance(model, FedModel):
        raise FedkitError(f"fedkit_build_model returned {type(model).__name__}, not a FedModel")
    plugins.hook.fedkit_extend_model(model=model, ctx=ctx)
    if ctx.config["freeze"]:
        model.freeze(ctx.config["freeze"])
    # dp.level=sample: no trainable batch norm (a frozen one, in eval mode, treats each
    # sample alone: it stays, with its pretrained statistics)
    model = prepare_model(model, ctx.config)
    if ctx.config["bn"] == "local" and not model.keep_batch_norm_local():
        raise FedkitError(
            "bn=local keeps the batch-norm layers on the clients, but this model has none "
            f"(model={ctx.config['model']}); use bn=average"
        )
    return model
