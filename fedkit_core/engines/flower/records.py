"""fedkit messages as Flower messages: named arrays and scalars, nothing else.

A fedkit :class:`~fedkit_core.contract.messages.Message` becomes a Flower ``RecordDict`` with an
``ArrayRecord`` (``arrays``: the named tensors, as NumPy arrays), a ``MetricRecord``
(``metrics``: int and float scalars) and a ``ConfigRecord`` (``config``: str and bool
scalars), so every scalar keeps its type. Each fedkit kind has its Flower message type.
A client that failed sends ``fedkit.error`` (and the error's class) in ``config``.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedkit_core.contract.messages import Arrays, Message
from fedkit_core.errors import FedkitError, NoSpace

#: fedkit kind -> Flower message type; ``describe`` is the engine's own handshake
MESSAGE_TYPES = {
    "describe": "query.fedkit_describe",
    "setup": "query.fedkit_setup",
    "fit": "train",
    "query": "query",
    "evaluate": "evaluate",
}
KINDS = {flower: kind for kind, flower in MESSAGE_TYPES.items()}
ERROR, ERROR_TYPE = "fedkit.error", "fedkit.error_type"


def kind_of(message_type: str) -> str:
    """The fedkit kind of a Flower message type (``query.default`` is ``query``)."""
    kind = KINDS.get(message_type.removesuffix(".default"))
    if kind is None:
        raise FedkitError(f"fedkit's ClientApp received an unknown message type {message_type!r}")
    return kind


def to_records(message: Message) -> RecordDict:
    """A fedkit message (or failed reply) as a Flower ``RecordDict``."""
    arrays = to_array_record(message.arrays)
    numbers = {
        k: v
        for k, v in message.scalars.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    others = {k: v for k, v in message.scalars.items() if k not in numbers}
    if message.error is not None:
        others[ERROR] = message.error
        user_error = isinstance(message.exception, FedkitError)
        kind = "NoSpace" if isinstance(message.exception, NoSpace) else "FedkitError"
        others[ERROR_TYPE] = kind if user_error else type(message.exception).__name__
    return RecordDict(
        {"arrays": arrays, "metrics": MetricRecord(numbers), "config": ConfigRecord(others)}
    )


def from_records(content: RecordDict, kind: str) -> Message:
    """The fedkit message carried by a Flower ``RecordDict`` (see :func:`to_records`).

    A failed reply keeps its text in ``error``; a client's :class:`FedkitError` comes back
    as a FedkitError (in ``exception``), so the server can show it as the local engine does.
    """
    arrays = from_array_record(content.array_records.get("arrays", ArrayRecord()))
    scalars = dict(content.metric_records.get("metrics", MetricRecord()))
    scalars.update(content.config_records.get("config", ConfigRecord()))
    error = scalars.pop(ERROR, None)
    error_type = scalars.pop(ERROR_TYPE, "")
    if error is not None:
        exception: Exception | None = None
        if error_type in ("FedkitError", "NoSpace"):
            exception = (NoSpace if error_type == "NoSpace" else FedkitError)(error)
        elif error_type not in ("", "NoneType"):  # the client raised: a bug, not user input
            exception = RuntimeError(str(error))
        return Message(kind, error=str(error), exception=exception)
    return Message(kind, arrays, scalars)


def to_array_record(arrays: Arrays) -> ArrayRecord:
    """Named tensors as an ``ArrayRecord`` of NumPy arrays (CPU copies)."""
    return ArrayRecord({name: Array(t.detach().cpu().numpy()) for name, t in arrays.items()})


def from_array_record(record: ArrayRecord) -> Arrays:
    """The named tensors of an ``ArrayRecord`` (writable copies)."""
    return {name: torch.from_numpy(np.array(a.numpy(), copy=True)) for name, a in record.items()}
