"""A client's evaluation: which views it evaluates, each batch scored per view, and the
``evaluate`` reply made of the scores.

``mode=pooled``: predictions go up (``<split>/<view>/probs`` or ``.../dice`` and
``<split>/labels``); ``mode=federated``: only sufficient statistics
(``<split>/<view>/<statistic>``). The scalar ``view`` names the view that scores the client.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from fedkit_core.contract.data import SEGMENTATION, Batch
from fedkit_core.contract.messages import Message
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext
from fedkit_core.metrics.segmentation import per_sample_dice
from fedkit_core.metrics.statistics import classification_stats, segmentation_stats

#: per split, per view (and ``labels``), the scored batches in sample order
Chunks = Mapping[str, Mapping[str, list[torch.Tensor]]]


def merged_views(results: list[Mapping[str, str | None] | None]) -> dict[str, str]:
    """The evaluation views of one client: plugins' entries win over the built-in's (which
    come last), and a view mapped to ``None`` is dropped."""
    views: dict[str, str | None] = {}
    for part in reversed(results):
        views.update(part or {})
    return {name: output for name, output in views.items() if output is not None}


def client_views(ctx: ClientContext) -> tuple[dict[str, str], str]:
    """The views the client of ``ctx`` evaluates (``{view: model output}``) and the one that
    scores it."""
    views = merged_views(ctx.hook.fedkit_eval_views(client=ctx))
    served = ctx.hook.fedkit_client_view(client=ctx) or "global"
    if served not in views:
        raise FedkitError(
            f"client {ctx.id!r} is scored with the view {served!r}, which no plugin "
            f"evaluates (views: {', '.join(views) or 'none'})"
        )
    return views, served


def evaluated_chunks(ctx: ClientContext, views: Mapping[str, str], splits: str) -> Chunks:
    """The client's model (set up for evaluation) scored on each of ``splits`` (comma
    separated), batch by batch."""
    chunks: dict[str, dict[str, list[torch.Tensor]]] = {}
    ctx.model.eval()
    with torch.inference_mode():
        for split in splits.split(","):
            chunks[split] = defaultdict(list)
            for batch in ctx.batches(split, batch_size=ctx.config["eval_batch_size"]):
                for name, values in scored(ctx, views, batch).items():
                    chunks[split][name].append(values)
    return chunks


def scored(ctx: ClientContext, views: Mapping[str, str], batch: Batch) -> dict[str, torch.Tensor]:
    """One evaluation batch scored per view (class probabilities, or per-sample Dice for
    segmentation), plus its labels (classification), on the CPU."""
    outputs = ctx.forward(ctx.model, batch.x)
    segmentation = ctx.task.kind == SEGMENTATION
    out: dict[str, torch.Tensor] = {}
    for view, key in views.items():
        if key not in outputs:
            raise FedkitError(f"the model has no output {key!r} to evaluate")
        if segmentation:
            out[view] = per_sample_dice(outputs[key], batch.y, ctx.task.num_classes).cpu()
        else:
            out[view] = F.softmax(outputs[key].float(), dim=1).cpu()
    if not segmentation:
        out["labels"] = batch.y.cpu()
    return out


def evaluation_reply(
    ctx: ClientContext, message: Message, views: Mapping[str, str], served: str, chunks: Chunks
) -> Message:
    """The reply to ``message`` from the per-split scored ``chunks`` (see :func:`scored`) of
    the client's samples, in order."""
    federated = message.scalars.get("mode") == "federated"
    arrays: dict[str, torch.Tensor] = {}
    for split, parts in chunks.items():
        arrays.update(_evaluation_arrays(ctx, split, parts, views, federated))
    return Message("evaluate", arrays, {"view": served})


def _evaluation_arrays(
    ctx: ClientContext,
    split: str,
    chunks: Mapping[str, list[torch.Tensor]],
    views: Mapping[str, str],
    federated: bool,
) -> dict[str, torch.Tensor]:
    segmentation = ctx.task.kind == SEGMENTATION
    num_classes = ctx.task.num_classes
    out: dict[str, torch.Tensor] = {}
    labels = None
    if not segmentation:  # an empty split (a client with few samples) has no batches
        labels = torch.cat(chunks.get("labels") or [torch.zeros(0, dtype=torch.long)])
    if labels is not None and not federated:
        out[f"{split}/labels"] = labels
    for view in views:
        values = (
            torch.cat(chunks[view])
            if chunks.get(view)
            else torch.zeros(0, num_classes, dtype=torch.float32)
        )
        if not federated:
            out[f"{split}/{view}/{'dice' if segmentation else 'probs'}"] = values
            continue
        if segmentation:
            stats = segmentation_stats(values.numpy())
        else:
            stats = classification_stats(
                values.numpy(), labels.numpy(), ctx.config["evaluation_bins"]
            )
        for name, value in stats.items():
            out[f"{split}/{view}/{name}"] = torch.as_tensor(value)
    return out
