"""One model that the clients of a process take turns with, and their evaluation done
together (see :func:`fedkit_core.engines.local.shared_model`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Protocol

import torch

from fedkit_core.contract.data import Batch
from fedkit_core.contract.messages import Message
from fedkit_core.devices import input_layout, joined
from fedkit_core.engines.client_scoring import client_views, evaluation_reply, scored
from fedkit_core.hooks.context import ClientContext
from fedkit_core.models.fedmodel import FedModel


class Member(Protocol):
    """A client sharing the model (a :class:`~fedkit_core.engines.client.ClientRuntime`)."""

    @property
    def id(self) -> str: ...

    @property
    def ctx(self) -> ClientContext: ...

    def frozen_inputs(self) -> None: ...


class SharedModel:
    """One model that the clients of a process take turns with (see
    :func:`fedkit_core.engines.local.shared_model`), and their evaluation done together.

    An ``evaluate`` message to one member evaluates every member at once, in batches of
    ``eval_batch_size`` samples that run across clients, and keeps the other members'
    replies until they are asked with the same message: a thousand clients of a few samples
    each cost a few full batches instead of thousands of tiny ones (whose fixed cost per
    forward pass dominates). The scores are those of per-client evaluation up to the
    rounding of the convolution kernels, whose summation order can depend on the batch
    size (probabilities agree to ~1e-7, as between the local and Flower engines).
    """

    def __init__(self, model: FedModel):
        self.model = model
        #: the set-up clients using the model in this process, in set-up order
        self.members: dict[str, Member] = {}
        self._asked: Message | None = None
        self._replies: dict[str, Message] = {}

    def join(self, client: Member) -> None:
        self.members[client.id] = client

    def evaluate(self, client: Member, message: Message) -> Message:
        """``client``'s reply to ``message``: kept from the members' joint evaluation of
        the same message, or from evaluating every member now."""
        reply = self._replies.pop(client.id, None)
        if reply is None or not _same(self._asked, message):
            self._replies = self._evaluate_all(message)
            self._asked = message
            reply = self._replies.pop(client.id)
        return reply

    def _evaluate_all(self, message: Message) -> dict[str, Message]:
        """Every member's reply to ``message``. Without plugins (the only case a model is
        shared) every member evaluates the same views, those of the built-in."""
        members = list(self.members.values())
        first = members[0]
        views, served = client_views(first.ctx)  # the built-in's, the same for every member
        self.model.load_shared(message.arrays)
        for member in members:
            member.frozen_inputs()
        self.model.eval()
        chunks: dict[str, dict[str, dict[str, list[torch.Tensor]]]] = {m.id: {} for m in members}
        with torch.inference_mode():
            for split in str(message.scalars["splits"]).split(","):
                parts: dict[str, list[torch.Tensor]] = defaultdict(list)
                for batch in _joint_batches(members, split):
                    for name, values in scored(first.ctx, views, batch).items():
                        parts[name].append(values)
                whole = {name: torch.cat(values) for name, values in parts.items()}
                offset = 0
                for member in members:
                    n = len(member.ctx.data[split])
                    sliced = {name: [v[offset : offset + n]] for name, v in whole.items()}
                    chunks[member.id][split] = sliced if n else {}
                    offset += n
        return {
            m.id: evaluation_reply(m.ctx, message, views, served, chunks[m.id]) for m in members
        }


def _joint_batches(members: list[Member], split: str) -> Iterator[Batch]:
    """Batches of ``eval_batch_size`` samples running through the members' ``split`` in
    member order (the members' data come from one task: one normaliser), as
    :meth:`ClientContext.batches` makes them."""
    ctx = members[0].ctx
    size = ctx.config["eval_batch_size"]
    images: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []

    def batch() -> Batch:
        x = input_layout(
            ctx.data.normalizer(joined(images, ctx.device)), ctx.config["channels_last"]
        )
        y = joined(targets, ctx.device).long()
        return Batch(x, y, torch.arange(len(y)))

    filled = 0
    for member in members:
        data, done = member.ctx.data[split], 0
        while done < len(data):
            take = min(size - filled, len(data) - done)
            images.append(data.images[done : done + take])
            targets.append(data.targets[done : done + take])
            filled, done = filled + take, done + take
            if filled == size:
                yield batch()
                images, targets, filled = [], [], 0
    if filled:
        yield batch()


def _same(asked: Message | None, message: Message) -> bool:
    """Whether ``message`` asks what ``asked`` asked (the same object, or equal contents)."""
    if asked is None:
        return False
    if asked is message:
        return True
    return (
        asked.scalars == message.scalars
        and asked.arrays.keys() == message.arrays.keys()
        and all(torch.equal(asked.arrays[k], message.arrays[k]) for k in asked.arrays)
    )
