"""What a client sends up after training: the plugins' report beside the trained arrays,
made private (clipped, only the scalars a private run may carry) when the run is.

Two steps, because a client's state has changed between them (see
:meth:`~fedkit_core.engines.client.ClientRuntime.fit`): :func:`plugin_report` gathers and
checks what the plugins add, :func:`fit_reply` makes the reply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fedkit_core.contract.channels import reserved
from fedkit_core.contract.messages import Message, Payload, check_arrays, check_scalars
from fedkit_core.contract.protocol import PAYLOAD
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext
from fedkit_core.privacy.layer import client_reply, is_private


def plugin_report(ctx: ClientContext) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The scalars and arrays the plugins report after a client's training
    (``fedkit_client_report``), checked: no reserved name, arrays fit to send."""
    sent = Payload()
    reported: dict[str, Any] = {}
    for extra in ctx.hook.fedkit_client_report(client=ctx):
        if isinstance(extra, Payload):
            sent.merge(extra, "fedkit_client_report")
        else:
            reported.update(extra or {})
    reported.update(sent.scalars)
    problem = reserved(reported, f"a plugin of client {ctx.id!r}")
    if problem:
        raise FedkitError(problem)
    return reported, check_arrays(sent.arrays, f"client {ctx.id} report")


def fit_reply(
    ctx: ClientContext,
    message: Message,
    scalars: dict[str, Any],
    extras: Mapping[str, torch.Tensor],
    dp_report: Callable[[], dict[str, Any]] | None,
    privatised: Sequence[str],
) -> Message:
    """The fit reply to ``message``: the model's shared arrays, the plugins' ``extras`` and
    ``scalars``; in a private run, the update clipped and the scalars restricted
    (:func:`~fedkit_core.privacy.layer.client_reply`), DP-SGD's report (``dp_report``) in."""
    arrays = ctx.model.shared_state()
    if is_private(ctx.config):
        if extras:  # DP and SecAgg+ protect the model's update, not a plugin's arrays
            raise FedkitError(
                f"a plugin sends arrays up with the update ({', '.join(sorted(extras))}), "
                "which differential privacy and secure aggregation do not cover; run it "
                "without dp.* and secagg.enabled"
            )
        if dp_report is not None:
            scalars.update(dp_report())
        arrays, scalars = client_reply(
            ctx.config,
            message.arrays,
            arrays,
            {**scalars, **{k: v for k, v in message.scalars.items() if k == "dp.clip"}},
            privatised,
            f"client {ctx.id!r}",
        )
    arrays = {**arrays, **{PAYLOAD + k: v for k, v in extras.items()}}
    return Message("fit", arrays, check_scalars(scalars, f"client {ctx.id} report"))
