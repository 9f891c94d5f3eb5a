"""What travels between server and clients: named arrays and plain scalars, nothing else.

These map one to one onto Flower's records (``ArrayRecord`` for arrays, ``MetricRecord`` /
``ConfigRecord`` for scalars), which is what keeps plugins engine-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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


@dataclass
class Update:
    """A client's contribution to aggregation: its uploaded shared arrays and its scalars."""

    client_id: str
    arrays: Arrays
    scalars: Scalars

    @property
    def num_examples(self) -> int:
        return int(self.scalars.get("num_examples", 0))


@dataclass
class Reply:
    """A client's answer to an extra query (see ``fedkit_answer_query``)."""

    arrays: Arrays = field(default_factory=dict)
    scalars: Scalars = field(default_factory=dict)


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
