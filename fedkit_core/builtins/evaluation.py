"""The built-in evaluation view: the received global model's ``logits`` on every client,
pooled over clients into the ``global`` scope."""

from __future__ import annotations

from fedkit_core.hooks.hookspecs import hookimpl


@hookimpl(trylast=True)
def fedkit_eval_views(client):
    return {"global": "logits"}
