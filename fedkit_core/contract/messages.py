"""What travels between server and clients: named arrays and plain scalars, nothing else.

These map one to one onto Flower's records (``ArrayRecord`` for arrays, ``MetricRecord`` /
``ConfigRecord`` for scalars), which is what keeps plugins engine-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedkit_core.errors import FedkitError

Scalar = int | float | str | bool
Arrays = dict[str, torch.Tensor]
Scalars = dict[str, Scalar]


@dataclass
class Message:
    """One message of the protocol.

    ``kind`` is ``"setup"``, ``"fit"``, ``"query"`` or ``"evaluate"``; a reply carries the same
    kind, and ``error`` when the client failed (then arrays and scalars may be empty).
    """

    kind: str
    arrays: Arrays = field(default_factory=dict)
    scalars: Scalars = field(default_factory=dict)
    error: str | None = None
    #: the client's exception, in-process only (never serialised): lets the CLI show its
    #: traceback under --debug
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def bug(self) -> bool:
        """The client failed on an exception other than a :class:`FedkitError`: a fault in a
        plugin or in fedkit rather than in the user's input."""
        return self.exception is not None and not isinstance(self.exception, FedkitError)


@dataclass
class Update:
    """A client's contribution to aggregation: its uploaded shared arrays, its scalars and
    the arrays plugins sent up beside the model (``payload``: what ``fedkit_client_report``
    returned as a :class:`Payload`, e.g. SCAFFOLD's control variates)."""

    client_id: str
    arrays: Arrays
    scalars: Scalars
    payload: Arrays = field(default_factory=dict)

    @property
    def num_examples(self) -> int:
        return int(self.scalars.get("num_examples", 0))


@dataclass
class Payload:
    """Named arrays and scalars a plugin adds to a message: what the server sends with a fit
    message (``fedkit_configure_fit``), what a client sends up with its update
    (``fedkit_client_report``) or what it answers to a query (``fedkit_answer_query``)."""

    arrays: Arrays = field(default_factory=dict)
    scalars: Scalars = field(default_factory=dict)

    def merge(self, other: Payload, origin: str) -> None:
        """Add ``other``'s entries; a name sent twice is an error (plugins would collide)."""
        for mine, theirs in ((self.arrays, other.arrays), (self.scalars, other.scalars)):
            clash = sorted(set(mine) & set(theirs))
            if clash:
                raise TypeError(f"{origin}: {clash[0]!r} is sent by two plugins")
            mine.update(theirs)


#: A client's answer to an extra query (the same named arrays and scalars as any payload).
Reply = Payload


def enclose(message: Message, inner: Message, prefix: str) -> Message:
    """``message`` also carrying ``inner``'s arrays and scalars, their names under ``prefix``:
    two messages in one round trip (see :func:`take_out`)."""
    return Message(
        message.kind,
        {**message.arrays, **{prefix + k: v for k, v in inner.arrays.items()}},
        {**message.scalars, **{prefix + k: v for k, v in inner.scalars.items()}},
    )


def take_out(message: Message, prefix: str, kind: str) -> tuple[Message, Message]:
    """``message`` without the entries named under ``prefix``, and those entries (names
    without it) as a message of ``kind``: what :func:`enclose` put together. A failed
    ``message`` gives two failed messages."""
    if message.error is not None:
        inner = Message(kind, error=message.error, exception=message.exception)
        return message, inner
    n = len(prefix)
    outer = Message(
        message.kind,
        {k: v for k, v in message.arrays.items() if not k.startswith(prefix)},
        {k: v for k, v in message.scalars.items() if not k.startswith(prefix)},
    )
    inner = Message(
        kind,
        {k[n:]: v for k, v in message.arrays.items() if k.startswith(prefix)},
        {k[n:]: v for k, v in message.scalars.items() if k.startswith(prefix)},
    )
    return outer, inner


def message_bytes(message: Message) -> int:
    """The size of a message's content as serialised: every array's data plus every scalar
    (8 bytes a number, the UTF-8 length of a string) plus the names of both."""
    size = 0
    for name, tensor in message.arrays.items():
        size += len(name.encode()) + tensor.numel() * tensor.element_size()
    for name, value in message.scalars.items():
        size += len(name.encode())
        size += len(value.encode()) if isinstance(value, str) else 8
    return size


def check_scalars(scalars: dict, origin: str) -> Scalars:
    """Refuse anything but plain scalars, so a plugin cannot smuggle objects across."""
    for key, value in scalars.items():
        if not isinstance(key, str) or not isinstance(value, (int, float, str, bool)):
            raise TypeError(
                f"{origin}: scalar {key!r} must be int/float/str/bool, got {type(value)}"
            )
    return dict(scalars)


def check_arrays(arrays: dict, origin: str) -> Arrays:
    """Refuse anything but named tensors; return detached CPU copies-by-reference."""
    out: Arrays = {}
    for key, value in arrays.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise TypeError(f"{origin}: array {key!r} must be a torch.Tensor, got {type(value)}")
        out[key] = value.detach().cpu()
    return out
