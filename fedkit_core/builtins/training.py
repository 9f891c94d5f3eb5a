"""The built-in optimiser, driven by the ``optimizer``, ``momentum``, ``weight_decay`` and
``adam_betas`` config keys; each parameter group keeps its own learning rate."""

from __future__ import annotations

import torch

from fedkit_core.hooks.hookspecs import hookimpl


@hookimpl(trylast=True)
def fedkit_optimizer(client, param_groups):
    cfg = client.config
    kind, wd = cfg["optimizer"], cfg["weight_decay"]
    if kind == "sgd":
        return torch.optim.SGD(
            param_groups, lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=wd
        )
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(param_groups, lr=cfg["lr"], betas=tuple(cfg["adam_betas"]), weight_decay=wd)
