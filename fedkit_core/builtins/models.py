"""The built-in model builder, driven by the ``model``, ``pretrained`` and ``model_weights`` keys."""

from __future__ import annotations

from fedkit_core.hooks.hookspecs import hookimpl
from fedkit_core.models import build_model
from fedkit_core.tasks.loading import fixed_normalizer


@hookimpl(trylast=True)
def fedkit_build_model(ctx):
    cfg = ctx.config
    return build_model(
        ctx.task,
        cfg["model"],
        cfg["pretrained"],
        cfg["model_weights"],
        tuple(cfg["unet_channels"]),
        # the task's normaliser, fixed by the config for a pretrained backbone's input
        normalizer=fixed_normalizer(cfg, ctx.task.in_channels),
    )
